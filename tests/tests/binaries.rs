//! The common face of the four binaries, run as a user runs them: `--help`, config errors,
//! `--check` against the real servers, the metrics endpoint, and SIGTERM.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sluice_tests::*;

const BINARIES: [&str; 4] = [
    "capture-mysql",
    "capture-mongo",
    "apply-clickhouse",
    "apply-mongo",
];

/// A config file pointing the binary at the test servers, plus `extra` lines.
fn config_for(binary: &str, extra: &str) -> tempfile::NamedTempFile {
    let source = match binary {
        "capture-mysql" => format!(
            "[mysql]\nurl = \"{}\"\n{}",
            mysql_url(),
            sluice_tests::mysql_tls()
        ),
        // The oplog mode works on every test server (mongo-java-server has no cluster-wide
        // change streams).
        "capture-mongo" => format!(
            "[mongodb]\nuri = \"{}\"\nmode = \"oplog\"\n",
            mongo_source_url()
        ),
        "apply-clickhouse" => format!("[clickhouse]\nurl = \"{}\"\n", clickhouse_url()),
        "apply-mongo" => format!("[mongodb]\nuri = \"{}\"\n", mongo_target_url()),
        other => panic!("unknown binary {other}"),
    };
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), format!("{extra}\n{source}{}", kafka_section())).unwrap();
    f
}

fn run(binary: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin(binary));
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run binary")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn help_describes_the_common_options() {
    for b in BINARIES {
        let o = run(b, &["--help"], &[]);
        assert!(o.status.success(), "{b} --help: {}", text(&o));
        let t = text(&o);
        for opt in ["--config", "--check", "--print-config", "--version"] {
            assert!(t.contains(opt), "{b} --help lacks {opt}: {t}");
        }
        // It opens with what the binary does, not with a note about the options.
        let first = t.lines().next().unwrap_or_default();
        let does = match b {
            "capture-mysql" => "binlog",
            "capture-mongo" => "MongoDB",
            "apply-clickhouse" => "ClickHouse",
            _ => "MongoDB",
        };
        assert!(
            first.contains(does) && !first.contains("Arguments"),
            "{b} --help opens with {first:?}"
        );
    }
}

/// A log level that is no level (`warning`, `verbose`), in `[log] level` or in `RUST_LOG`,
/// is refused at start with the levels listed (exit 2), not taken for a target that silences
/// every line, the errors included.
#[test]
fn a_log_level_that_is_no_level_is_refused_with_the_levels() {
    for b in BINARIES {
        let cfg = config_for(b, "[log]\nlevel = \"warning\"\n");
        let o = run(b, &["-c", cfg.path().to_str().unwrap(), "--check"], &[]);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{b}: {t}");
        assert!(
            t.contains("log.level")
                && t.contains("\"warning\" is not a level")
                && t.contains("trace, debug, info, warn, error, off"),
            "{b}: {t}"
        );
        let cfg = config_for(b, "");
        let o = run(
            b,
            &["-c", cfg.path().to_str().unwrap(), "--check"],
            &[("RUST_LOG", "verbose")],
        );
        let t = text(&o);
        assert_eq!(o.status.code(), Some(2), "{b}: {t}");
        assert!(t.contains("RUST_LOG=\"verbose\""), "{b}: {t}");
    }
}

#[test]
fn unknown_keys_are_refused_with_their_name() {
    for b in BINARIES {
        let cfg = config_for(b, "[metrics]\nlisten = \"127.0.0.1:0\"\nlisten_port = 9\n");
        let o = run(
            b,
            &["--config", cfg.path().to_str().unwrap(), "--check"],
            &[],
        );
        assert_eq!(o.status.code(), Some(2), "{b}: {}", text(&o));
        let t = text(&o);
        assert!(t.contains("metrics.listen_port"), "{b}: {t}");
        assert!(t.contains(&cfg.path().display().to_string()), "{b}: {t}");
    }
}

#[test]
fn bad_values_are_refused_with_key_and_reason() {
    let cases: [(&str, &str, &str); 5] = [
        (
            "capture-mysql",
            "[metrics]\nlisten = \"nowhere\"\n",
            "metrics.listen",
        ),
        (
            "capture-mysql",
            "[topics]\ntemplate = \"{prefix}.{schema}\"\n",
            "unknown placeholder {schema}",
        ),
        (
            "apply-clickhouse",
            "[log]\nlevel = \"loud=[\"\n",
            "log.level",
        ),
        (
            "apply-mongo",
            "[consumer]\ngroup_id = \"\"\ntopics = [\"x\"]\n",
            "consumer.group_id",
        ),
        (
            "capture-mongo",
            "[kafka.properties]\n\"enable.idempotence\" = \"false\"\n",
            "kafka.properties.enable.idempotence",
        ),
    ];
    for (b, extra, needle) in cases {
        let cfg = config_for(b, extra);
        let o = run(b, &["-c", cfg.path().to_str().unwrap(), "--check"], &[]);
        assert_eq!(o.status.code(), Some(2), "{b} {extra}: {}", text(&o));
        assert!(
            text(&o).contains(needle),
            "{b}: wanted {needle:?} in {}",
            text(&o)
        );
    }
    // The same through an environment override.
    let cfg = config_for("apply-clickhouse", "");
    let o = run(
        "apply-clickhouse",
        &["-c", cfg.path().to_str().unwrap(), "--check"],
        &[("SLUICE__KAFKA__REQUEST_TIMEOUT_MS", "soon")],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("kafka.request_timeout_ms"),
        "{}",
        text(&o)
    );
}

#[test]
fn print_config_shows_defaults_and_overrides() {
    let cfg = config_for("capture-mysql", "");
    let o = run(
        "capture-mysql",
        &["-c", cfg.path().to_str().unwrap(), "--print-config"],
        &[("SLUICE__TOPICS__PREFIX", "cdc")],
    );
    assert!(o.status.success(), "{}", text(&o));
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(t.contains("prefix = \"cdc\""), "{t}");
    assert!(t.contains("server_id = 5400"), "{t}");
    assert!(
        t.contains(&format!("brokers = \"{}\"", kafka_brokers())),
        "{t}"
    );
}

/// The example config shipped in deploy/config/, and the environment overrides that point
/// it at the test servers instead of the compose stack's hosts.
fn example_config(binary: &str) -> (String, Vec<(&'static str, String)>) {
    let path = format!(
        "{}/../deploy/config/{binary}.toml",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut env = vec![("SLUICE__KAFKA__BROKERS", kafka_brokers())];
    env.push(match binary {
        "capture-mysql" => ("SLUICE__MYSQL__URL", mysql_url()),
        "capture-mongo" => ("SLUICE__MONGODB__URI", mongo_source_url()),
        "apply-clickhouse" => ("SLUICE__CLICKHOUSE__URL", clickhouse_url()),
        _ => ("SLUICE__MONGODB__URI", mongo_target_url()),
    });
    if binary == "capture-mysql" {
        env.push(match tls_dir() {
            Some(dir) => ("SLUICE__MYSQL__SSL_CA", format!("{dir}/ca.pem")),
            None => ("SLUICE__MYSQL__SSL_MODE", "disabled".to_string()),
        });
    }
    (path, env)
}

#[test]
fn example_configs_load_as_they_are() {
    for b in BINARIES {
        let (path, _) = example_config(b);
        let o = run(b, &["-c", &path, "--print-config"], &[]);
        assert!(o.status.success(), "{path}: {}", text(&o));
    }
}

#[test]
fn check_passes_against_the_test_servers() {
    for b in BINARIES {
        let (path, env) = example_config(b);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let o = run(b, &["-c", &path, "--check"], &env);
        assert!(o.status.success(), "{b} --check failed: {}", text(&o));
        assert!(text(&o).contains("checks passed"), "{b}: {}", text(&o));
    }
}

#[test]
fn check_names_an_unreachable_server() {
    let port = free_port();
    let cfg = config_for("capture-mysql", "");
    let o = run(
        "capture-mysql",
        &["-c", cfg.path().to_str().unwrap(), "--check"],
        &[(
            "SLUICE__MYSQL__URL",
            &format!("mysql://u:p@127.0.0.1:{port}"),
        )],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("[FAIL] mysql: cannot connect"),
        "{}",
        text(&o)
    );
}

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

/// Everything an exited child wrote to its (piped) stderr.
fn stderr_of(child: &mut std::process::Child) -> String {
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    err
}

#[test]
fn serves_metrics_and_exits_cleanly_on_sigterm() {
    for b in BINARIES {
        let port = free_port();
        let cfg = config_for(b, &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"));
        let mut cmd = Command::new(bin(b));
        if b.starts_with("capture") {
            // A capture of its own: no checkpoint of an earlier run (which may point into
            // binlogs purged since), no binlog connection shared with another test.
            cmd.env("SLUICE__CONNECTOR", unique("bin"));
            if b == "capture-mysql" {
                cmd.env("SLUICE__MYSQL__SERVER_ID", replica_server_id().to_string());
            }
        }
        let mut child = cmd
            .args(["-c", cfg.path().to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let metrics = loop {
            if let Some(body) = http_get(port, "/metrics") {
                break body;
            }
            assert!(
                Instant::now() < deadline,
                "{b}: no metrics endpoint on {port}"
            );
            if let Some(status) = child.try_wait().unwrap() {
                panic!("{b} exited early ({status}): {}", stderr_of(&mut child));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(metrics.starts_with("HTTP/1.1 200"), "{b}: {metrics}");
        assert!(
            metrics.contains(&format!("sluice_build_info{{binary=\"{b}\"")),
            "{b}: {metrics}"
        );
        assert!(metrics.contains("process_resident_memory_bytes"), "{b}");
        let health = http_get(port, "/healthz").unwrap();
        assert!(
            health.starts_with("HTTP/1.1 200") && health.ends_with("ok\n"),
            "{health}"
        );
        assert!(http_get(port, "/nope").unwrap().starts_with("HTTP/1.1 404"));

        let kill = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "{b} did not stop within 30 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let err = stderr_of(&mut child);
        assert_eq!(status.code(), Some(0), "{b} after SIGTERM: {err}");
        assert!(err.contains("stopped cleanly"), "{b}: {err}");
    }
}

/// The README's block of `--check` commands for the local test bed, run as written (with the
/// binaries of this build for `target/release/`): every check passes. Only against the test
/// bed's own servers (the block reads their addresses from `deploy/testbed.sh env`).
#[test]
fn the_readme_checks_pass_on_the_test_bed() {
    if mysql_url() != "mysql://sluice:sluice@127.0.0.1:13306" || tls_dir().is_none() {
        eprintln!("the_readme_checks_pass_on_the_test_bed: skipped (servers of one's own)");
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let marker = "<!-- the test bed's checks:";
    let after = &readme[readme
        .find(marker)
        .expect("the README marks its test-bed block")..];
    let start = after.find("```sh\n").unwrap() + "```sh\n".len();
    let block = &after[start..start + after[start..].find("```").unwrap()];
    assert!(block.contains("target/release/capture-mysql"), "{block}");
    let bin_dir = bin("capture-mysql").parent().unwrap().display().to_string();
    let script = block.replace("target/release", &bin_dir);
    let o = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(&root)
        .output()
        .unwrap();
    let t = text(&o);
    assert!(
        o.status.success(),
        "the README's test-bed checks failed:\n{script}\n{t}"
    );
    // One report per binary, every check passed.
    for b in BINARIES {
        assert!(t.contains(&format!("{b}: all ")), "{b} did not pass: {t}");
    }
    assert!(!t.contains("[FAIL]"), "{t}");
}

/// A MySQL URL whose port accepts connections and never speaks MySQL: `--check` says so
/// within the connect timeout (it printed nothing, for ever), naming the server, after the
/// Kafka line.
#[test]
fn a_port_that_does_not_speak_mysql_fails_the_check_in_bounded_time() {
    let port = silent_port();
    let cfg = config_for("capture-mysql", "");
    let url = format!("mysql://sluice:sluice@127.0.0.1:{port}");
    // (bounded from outside too: before, it never returned)
    let o = Command::new("timeout")
        .arg("120")
        .arg(bin("capture-mysql"))
        .args(["-c", cfg.path().to_str().unwrap(), "--check"])
        .env("SLUICE__MYSQL__URL", &url)
        .output()
        .expect("run capture-mysql");
    let out = text(&o);
    assert_ne!(o.status.code(), Some(124), "killed by timeout: {out}");
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("[ok  ] kafka"), "{out}");
    assert!(
        out.contains(&format!("no MySQL handshake from 127.0.0.1:{port}")),
        "{out}"
    );
}

/// The same for a ClickHouse URL whose port never answers HTTP.
#[test]
fn a_port_that_does_not_answer_http_fails_the_clickhouse_check_in_bounded_time() {
    let port = silent_port();
    let cfg = config_for("apply-clickhouse", "");
    let url = format!("http://127.0.0.1:{port}");
    let o = Command::new("timeout")
        .arg("120")
        .arg(bin("apply-clickhouse"))
        .args(["-c", cfg.path().to_str().unwrap(), "--check"])
        .env("SLUICE__CLICKHOUSE__URL", &url)
        .output()
        .expect("run apply-clickhouse");
    let out = text(&o);
    assert_ne!(o.status.code(), Some(124), "killed by timeout: {out}");
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("[ok  ] kafka"), "{out}");
    assert!(
        out.contains(&format!(
            "no answer from http://127.0.0.1:{port} within 15 s"
        )),
        "{out}"
    );
}

/// A local port that accepts connections and never says anything on them.
fn silent_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming() {
            held.push(s);
        }
    });
    port
}

/// `consumer.topics` is checked at load: a pattern that does not compile, or a pattern
/// written without its `^` (which librdkafka would take as a topic name and wait for forever),
/// is refused naming the key and the entry; a right one is listed by `--check` with the
/// topics it matches now.
#[test]
fn consumer_topics_are_checked_at_load_and_listed_by_check() {
    for (topics, says) in [
        (r#"["^ux\\.(ux_shop"]"#, "is not a valid pattern"),
        (
            r#"["ux\\.ux_shop\\..*"]"#,
            "a name without a leading ^ is taken literally",
        ),
    ] {
        let cfg = config_for(
            "apply-clickhouse",
            &format!("[consumer]\ngroup_id = \"g\"\ntopics = {topics}\n"),
        );
        let o = run(
            "apply-clickhouse",
            &["-c", cfg.path().to_str().unwrap(), "--check"],
            &[],
        );
        let out = text(&o);
        assert!(!o.status.success(), "{topics}: {out}");
        assert!(
            out.contains("consumer.topics") && out.contains(says),
            "{topics}: {out}"
        );
    }
    // A topic that exists is listed as matched.
    let topic = sluice_tests::unique("topics_check");
    {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> =
            rdkafka::ClientConfig::new()
                .set("bootstrap.servers", sluice_tests::kafka_brokers())
                .create()
                .unwrap();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let made = rt.block_on(admin.create_topics(
            &[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        ));
        assert!(made.unwrap().iter().all(|r| r.is_ok()));
    }
    let cfg = config_for(
        "apply-clickhouse",
        &format!("[consumer]\ngroup_id = \"g\"\ntopics = [\"^{topic}$\", \"no.such.topic\"]\n"),
    );
    let o = run(
        "apply-clickhouse",
        &["-c", cfg.path().to_str().unwrap(), "--check"],
        &[],
    );
    let out = text(&o);
    assert!(
        out.contains(&format!(
            "consumer.topics: patterns [\"^{topic}$\"], names [\"no.such.topic\"]: 1 topics \
             match now: {topic}"
        )),
        "{out}"
    );
}

/// The tools take the stages' name for the brokers (`SLUICE__KAFKA__BROKERS`) when their own
/// (`SLUICE_KAFKA_BROKERS`) is not set: one environment serves both.
#[test]
fn the_tools_read_the_stages_brokers_variable() {
    let o = Command::new(bin("sluice"))
        .args(["status", "--connector", "no-such-connector"])
        .env_remove("SLUICE_KAFKA_BROKERS")
        .env("SLUICE__KAFKA__BROKERS", sluice_tests::kafka_brokers())
        .output()
        .unwrap();
    let out = text(&o);
    assert!(
        out.contains("connector \"no-such-connector\": no checkpoint"),
        "it did not reach the brokers: {out}"
    );
}
