//! No secret in any output. Every binary gets distinctive secrets in its config file, its
//! environment and files named by `*_file` keys, then is made to fail in every way that
//! prints: `--print-config`, `--check` against servers that are not there and against the
//! test bed with wrong passwords, a run that fails at start, a syntax error in its config, all
//! at `RUST_LOG=trace`. Everything it printed is searched for the secrets.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_tests::{bin, free_port, mysql_url, tls_dir};

/// Each appears in one place only, so a leak says where it came from.
const URL_PW: &str = "UrlPw7f3aQ";
const KEY_PW: &str = "KeyPw91c2Q";
const ENV_PW: &str = "EnvPw55d0Q";
const FILE_PW: &str = "FilePw3b8eQ";
const MONGO_PW: &str = "MongoPw1b9Q";
const CH_PW: &str = "ChPw77e1Q";
const PROP_PW: &str = "PropPw42aQ";
const ALL: [&str; 7] = [URL_PW, KEY_PW, ENV_PW, FILE_PW, MONGO_PW, CH_PW, PROP_PW];

/// Run `binary` with `args`, this config and environment, at trace level, for at most `for`:
/// everything it printed.
fn run(
    binary: &str,
    args: &[&str],
    config: &str,
    env: &[(&str, String)],
    limit: Duration,
) -> String {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), config).unwrap();
    let mut cmd = Command::new(bin(binary));
    if !config.is_empty() {
        cmd.args(["-c", f.path().to_str().unwrap()]);
    }
    let mut child = cmd
        .args(args)
        .env("RUST_LOG", "trace")
        .envs(env.iter().map(|(k, v)| (*k, v.clone())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let o = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let e = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.wait();
    format!("{}{}", o.join().unwrap(), e.join().unwrap())
}

struct Setup {
    _dir: tempfile::TempDir,
    file_pw: String,
    ch_pw: String,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let file_pw = dir.path().join("kafka-password");
    std::fs::write(&file_pw, format!("{FILE_PW}\n")).unwrap();
    let ch_pw = dir.path().join("clickhouse-password");
    std::fs::write(&ch_pw, CH_PW).unwrap();
    Setup {
        file_pw: file_pw.display().to_string(),
        ch_pw: ch_pw.display().to_string(),
        _dir: dir,
    }
}

/// `[kafka]` with SASL credentials: the password from a file, another in a property.
fn kafka(brokers: &str, s: &Setup) -> String {
    let tls = match tls_dir() {
        Some(d) => format!("security_protocol = \"sasl_ssl\"\nssl_ca = \"{d}/ca.pem\"\n"),
        None => "security_protocol = \"sasl_plaintext\"\n".to_string(),
    };
    format!(
        "[kafka]\nbrokers = \"{brokers}\"\n{tls}sasl_mechanism = \"SCRAM-SHA-256\"\n\
         sasl_username = \"scramuser\"\nsasl_password_file = \"{}\"\nrequest_timeout_ms = 3000\n\
         [kafka.properties]\n\"ssl.key.password\" = \"{PROP_PW}\"\n",
        s.file_pw
    )
}

/// The configs of every binary, against `mysql`, `brokers`, `ch` and `mongo` (a host:port
/// each), with every secret it can hold.
fn configs(
    s: &Setup,
    mysql: &str,
    brokers: &str,
    ch: &str,
    mongo: &str,
) -> Vec<(&'static str, String)> {
    let tls = sluice_tests::mysql_tls();
    vec![
        (
            "capture-mysql",
            format!(
                "[mysql]\nurl = \"mysql://sluice:{URL_PW}@{mysql}\"\npassword = \"{KEY_PW}\"\n{tls}\
                 heartbeat_ms = 1000\n{}",
                kafka(brokers, s)
            ),
        ),
        (
            "capture-mongo",
            format!(
                "[mongodb]\nuri = \"mongodb://app:{MONGO_PW}@{mongo}/?directConnection=true&serverSelectionTimeoutMS=2000\"\n\
                 mode = \"oplog\"\n{}",
                kafka(brokers, s)
            ),
        ),
        (
            "apply-clickhouse",
            format!(
                "[clickhouse]\nurl = \"http://{ch}\"\nuser = \"sluice\"\npassword_file = \"{}\"\n{}",
                s.ch_pw,
                kafka(brokers, s)
            ),
        ),
        (
            "apply-mongo",
            format!(
                "[mongodb]\nuri = \"mongodb://app:{MONGO_PW}@{mongo}/?directConnection=true&serverSelectionTimeoutMS=2000\"\n{}",
                kafka(brokers, s)
            ),
        ),
    ]
}

fn clean(what: &str, out: &str, leaks: &mut Vec<String>) {
    for secret in ALL {
        if out.contains(secret) {
            leaks.push(format!("{what} printed {secret}:\n{out}"));
        }
    }
}

#[test]
fn no_binary_prints_a_secret_however_it_fails() {
    let s = setup();
    let env = [("SLUICE__KAFKA__SASL_USERNAME", "scramuser".to_string())];
    let mut leaks = Vec::new();
    let mut printed = 0usize;
    // Servers that are not there.
    let closed = format!("127.0.0.1:{}", free_port());
    // The test bed's, with wrong passwords (the SASL listener when it has one).
    let mysql_bed = mysql_url().rsplit('@').next().unwrap().to_string();
    let kafka_bed = std::env::var("SLUICE_KAFKA_SASL_BROKERS")
        .unwrap_or_else(|_| sluice_tests::kafka_brokers());
    let ch_bed = sluice_tests::clickhouse_url()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    let mongo_bed = sluice_tests::mongo_source_url()
        .trim_start_matches("mongodb://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let sets = [
        (
            "servers absent",
            configs(&s, &closed, &closed, &closed, &closed),
        ),
        (
            "wrong passwords",
            configs(&s, &mysql_bed, &kafka_bed, &ch_bed, &mongo_bed),
        ),
    ];
    for (servers, set) in &sets {
        for (binary, config) in set {
            // The environment holds a secret too.
            let mut env = env.to_vec();
            if *binary == "apply-clickhouse" {
                env.push((
                    "SLUICE__KAFKA__PROPERTIES__SASL.OAUTHBEARER.CONFIG",
                    format!("principal=sluice extension_token={ENV_PW}"),
                ));
            } else {
                env.push((
                    "SLUICE__KAFKA__PROPERTIES__SSL.KEYSTORE.PASSWORD",
                    ENV_PW.to_string(),
                ));
            }
            let print = run(
                binary,
                &["--print-config"],
                config,
                &env,
                Duration::from_secs(10),
            );
            assert!(
                print.contains("***"),
                "{binary} --print-config shows no masked secret:\n{print}"
            );
            clean(
                &format!("{binary} --print-config ({servers})"),
                &print,
                &mut leaks,
            );
            let check = run(binary, &["--check"], config, &env, Duration::from_secs(60));
            clean(&format!("{binary} --check ({servers})"), &check, &mut leaks);
            let started = run(binary, &[], config, &env, Duration::from_secs(12));
            clean(&format!("{binary} run ({servers})"), &started, &mut leaks);
            printed += print.len() + check.len() + started.len();
        }
    }
    // A property this build refuses, whose value is a secret (librdkafka's message quotes it).
    let out = run(
        "capture-mysql",
        &["--print-config"],
        "",
        &[(
            "SLUICE__KAFKA__PROPERTIES__SASL.OAUTHBEARER.CLIENT.SECRET",
            ENV_PW.to_string(),
        )],
        Duration::from_secs(10),
    );
    assert!(
        out.contains("sasl.oauthbearer.client.secret"),
        "not refused:\n{out}"
    );
    clean("capture-mysql with a refused property", &out, &mut leaks);
    // A syntax error on the line that holds a password.
    let broken = format!("[mysql]\nurl = \"mysql://u:{URL_PW}@h:1\npassword = \"{KEY_PW}\n");
    let out = run(
        "capture-mysql",
        &["--print-config"],
        &broken,
        &[],
        Duration::from_secs(10),
    );
    assert!(out.contains("line"), "no syntax error reported:\n{out}");
    clean("capture-mysql with a syntax error", &out, &mut leaks);
    // The operator tool, with a secret on its command line.
    let prop = format!("sasl.password={PROP_PW}");
    let out = run(
        "sluice",
        &[
            "dead-letters",
            "list",
            "--brokers",
            &closed,
            "-X",
            "security.protocol=sasl_plaintext",
            "-X",
            "sasl.mechanism=PLAIN",
            "-X",
            "sasl.username=u",
            "-X",
            &prop,
        ],
        "",
        &[("RUST_LOG", "trace".to_string())],
        Duration::from_secs(30),
    );
    clean("sluice dead-letters list", &out, &mut leaks);
    printed += out.len();
    assert!(
        printed > 10_000,
        "too little was printed to tell: {printed} bytes"
    );
    assert!(leaks.is_empty(), "{}", leaks.join("\n\n=====\n\n"));
}
