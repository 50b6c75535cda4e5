//! Measuring a stage: start it, scrape its metrics, read its CPU time and peak memory from
//! /proc.

pub use sluice_tests::capture::scrape;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_tests::free_port;

pub fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// User + system CPU seconds of a process, from /proc (the process collector's metric is
/// rounded to whole seconds).
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = &stat[stat.rfind(')').ok_or_else(|| anyhow::anyhow!("bad stat"))? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    Ok(ticks / 100.0)
}

/// Peak resident memory of a process (VmHWM), in bytes.
pub fn peak_rss(pid: u32) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .ok_or_else(|| anyhow::anyhow!("no VmHWM"))?
        .parse()?;
    Ok(kb * 1024.0)
}

pub struct Stage {
    pub name: &'static str,
    pub wall: f64,
    pub cpu: f64,
    pub rss: f64,
}

/// Run `binary` with `config` until its `counter` metric reaches `rows`.
pub async fn measure(
    name: &'static str,
    binary: &std::path::Path,
    config: String,
    counter: &str,
    rows: u64,
) -> anyhow::Result<(Stage, Child)> {
    let start = Instant::now();
    let (mut child, port, file) = spawn_stage(binary, &config)?;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("{name} exited early: {status}");
        }
        let Some(body) = scrape(port) else { continue };
        if metric(&body, counter) >= rows as f64 {
            let stage = Stage {
                name,
                wall: start.elapsed().as_secs_f64(),
                cpu: cpu_seconds(child.id())?,
                rss: peak_rss(child.id())?,
            };
            // Keep the file alive until the process has read it (it has, by now).
            drop(file);
            return Ok((stage, child));
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(1800),
            "{name} not done after 30 minutes"
        );
    }
}

pub fn stop_child(mut child: Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

/// CPU seconds and peak RSS bytes of a pair of running stages (capture, apply), then stop both.
pub fn usage_and_stop(capture: Child, apply: Child) -> anyhow::Result<[(f64, f64); 2]> {
    let usage = [
        (cpu_seconds(capture.id())?, peak_rss(capture.id())?),
        (cpu_seconds(apply.id())?, peak_rss(apply.id())?),
    ];
    stop_child(capture);
    stop_child(apply);
    Ok(usage)
}

/// The acknowledgement times each load writer recorded, writer by writer.
pub async fn join_writers(
    writers: Vec<tokio::task::JoinHandle<anyhow::Result<Vec<Instant>>>>,
) -> anyhow::Result<Vec<Vec<Instant>>> {
    let mut acked = Vec::with_capacity(writers.len());
    for w in writers {
        acked.push(w.await??);
    }
    Ok(acked)
}

/// Start a stage in the background with a config (a metrics section is added).
pub fn spawn_stage(
    binary: &std::path::Path,
    config: &str,
) -> anyhow::Result<(Child, u16, tempfile::NamedTempFile)> {
    let port = free_port();
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(
        file.path(),
        format!("{config}\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n[log]\nlevel = \"warn\"\n"),
    )?;
    let child = Command::new(binary)
        .args(["-c", file.path().to_str().unwrap()])
        .stdout(Stdio::null())
        .spawn()?;
    Ok((child, port, file))
}

pub fn num_cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0)
}

/// The machine a benchmark ran on.
pub struct Machine {
    pub cores: usize,
    pub memory_gib: f64,
    pub cpu: String,
}

pub fn machine() -> Machine {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib: f64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    Machine {
        cores: num_cores(),
        memory_gib: kib / 1024.0 / 1024.0,
        cpu,
    }
}

impl Machine {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "cores": self.cores,
            "memory_gib": (self.memory_gib * 10.0).round() / 10.0,
            "cpu": self.cpu,
        })
    }
}

/// A published figure range beside ours: (measure, the report's, ours).
pub fn print_comparison(title: &str, rows: &[(&str, String, String)]) {
    println!("\n{title}\n");
    println!("| measure | report | sluice, this machine |");
    println!("|---|---|---|");
    for (m, theirs, ours) in rows {
        println!("| {m} | {theirs} | {ours} |");
    }
}

/// Command-line options of the benchmarks: `--name VALUE` options, `--flag` switches (listed in
/// `switches`), and bare words.
pub struct Args {
    args: Vec<String>,
    switches: &'static [&'static str],
}

impl Args {
    /// The command line, checked: `--help` (or `-h`) prints `usage` and exits 0; an argument
    /// that is none of `options` (each followed by its value), `switches` or, when `bare`, a
    /// bare word, prints what was wrong and `usage`, and exits 2, before anything runs.
    pub fn from_env(
        usage: &str,
        options: &[&str],
        switches: &'static [&'static str],
        bare: bool,
    ) -> Self {
        let args: Vec<String> = std::env::args().skip(1).collect();
        if let Err(e) = check(&args, options, switches, bare) {
            if e.is_empty() {
                println!("usage: {usage}");
                std::process::exit(0);
            }
            eprintln!("{e}\nusage: {usage}");
            std::process::exit(2);
        }
        Self { args, switches }
    }

    pub fn switch(&self, name: &str) -> bool {
        self.args.iter().any(|a| a == name)
    }

    /// The value of `--name VALUE`, or `default`.
    pub fn option(&self, name: &str, default: u64) -> anyhow::Result<u64> {
        match self.args.iter().position(|a| a == name) {
            Some(i) => Ok(self
                .args
                .get(i + 1)
                .ok_or_else(|| anyhow::anyhow!("{name} needs a value"))?
                .parse()?),
            None => Ok(default),
        }
    }

    /// The value of `--name VALUE` as text, if given.
    pub fn text(&self, name: &str) -> Option<String> {
        let i = self.args.iter().position(|a| a == name)?;
        self.args.get(i + 1).cloned()
    }

    /// The first word that is neither an option, a switch nor an option's value.
    pub fn first_bare(&self) -> Option<&str> {
        let mut i = 0;
        while i < self.args.len() {
            let a = &self.args[i];
            if self.switches.contains(&a.as_str()) {
                i += 1;
            } else if a.starts_with("--") {
                i += 2;
            } else {
                return Some(a);
            }
        }
        None
    }
}

/// Whether `args` are all known (see [`Args::from_env`]): an empty error asks for the usage.
fn check(args: &[String], options: &[&str], switches: &[&str], bare: bool) -> Result<(), String> {
    let mut bares = 0;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "--help" || a == "-h" {
            return Err(String::new());
        } else if switches.contains(&a) {
            i += 1;
        } else if options.contains(&a) {
            if i + 1 >= args.len() {
                return Err(format!("{a} needs a value"));
            }
            i += 2;
        } else if a.starts_with('-') {
            return Err(format!("unknown argument {a}"));
        } else if bare && bares == 0 {
            bares += 1;
            i += 1;
        } else {
            return Err(format!("unexpected argument {a}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod args_tests {
    use super::check;

    #[test]
    fn unknown_arguments_are_refused_and_help_asks_for_the_usage() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (opts, sw) = (&["--runs"][..], &["--snapshot"][..]);
        assert_eq!(
            check(&v(&["--runs", "3", "--snapshot"]), opts, sw, false),
            Ok(())
        );
        assert_eq!(check(&v(&["1000", "--runs", "3"]), opts, sw, true), Ok(()));
        assert_eq!(check(&v(&["--help"]), opts, sw, false), Err(String::new()));
        assert_eq!(check(&v(&["-h"]), opts, sw, false), Err(String::new()));
        assert_eq!(
            check(&v(&["--run", "3"]), opts, sw, false),
            Err("unknown argument --run".into())
        );
        assert_eq!(
            check(&v(&["--runs"]), opts, sw, false),
            Err("--runs needs a value".into())
        );
        assert_eq!(
            check(&v(&["7"]), opts, sw, false),
            Err("unexpected argument 7".into())
        );
        assert_eq!(
            check(&v(&["7", "8"]), opts, sw, true),
            Err("unexpected argument 8".into())
        );
    }
}

/// The workspace's `target/release`, checked to hold the stages a benchmark runs.
pub fn release_dir(binaries: &[&str]) -> anyhow::Result<std::path::PathBuf> {
    let release = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release");
    for b in binaries {
        anyhow::ensure!(
            release.join(b).exists(),
            "{} is missing: run `cargo build --release --bins` first",
            release.join(b).display()
        );
    }
    Ok(release)
}

/// Latencies of a sustained run: writer `w`'s batch `k` (acknowledged at `acked[w][k]`) is
/// visible at the first poll (`seen`: time, rows counted per writer's target) at or after its
/// acknowledgement that counts `1 + (k + 1) * batch` rows (one warm-up row each).
pub struct Latencies {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    /// When every writer's rows were all visible.
    pub all_visible: Instant,
}

pub fn latencies(acked: &[Vec<Instant>], seen: &[(Instant, Vec<u64>)], batch: u64) -> Latencies {
    let mut lat = Vec::new();
    for (w, times) in acked.iter().enumerate() {
        for (k, at) in times.iter().enumerate() {
            let need = 1 + (k as u64 + 1) * batch;
            let visible = seen
                .iter()
                .find(|(when, n)| n[w] >= need && when >= at)
                .map(|(when, _)| *when)
                .unwrap_or_else(Instant::now);
            lat.push(visible.duration_since(*at).as_secs_f64());
        }
    }
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let pct = |p: f64| lat[((lat.len() as f64 - 1.0) * p).round() as usize];
    let want: Vec<u64> = acked.iter().map(|t| 1 + t.len() as u64 * batch).collect();
    Latencies {
        p50: pct(0.5),
        p99: pct(0.99),
        max: *lat.last().unwrap_or(&0.0),
        all_visible: seen
            .iter()
            .find(|(_, n)| n.iter().zip(&want).all(|(x, w)| x >= w))
            .map(|(at, _)| *at)
            .unwrap_or_else(Instant::now),
    }
}

/// `config` with the TOML of environment variable `var` merged in (for experiments such as
/// `BENCH_APPLY_EXTRA='[batch]\nmax_events = 5000'`): its tables merge into the config's, its
/// keys replace the config's.
pub fn with_extra(config: String, var: &str) -> anyhow::Result<String> {
    let extra = std::env::var(var).unwrap_or_default();
    if extra.trim().is_empty() {
        return Ok(config);
    }
    merge_toml(&config, &extra).map_err(|e| anyhow::anyhow!("{var}: {e}"))
}

/// `extra`'s tables merged into `config`'s, its keys replacing `config`'s.
fn merge_toml(config: &str, extra: &str) -> anyhow::Result<String> {
    fn merge(into: &mut toml::Table, from: toml::Table) {
        for (k, v) in from {
            match (into.get_mut(&k), v) {
                (Some(toml::Value::Table(a)), toml::Value::Table(b)) => merge(a, b),
                (_, v) => {
                    into.insert(k, v);
                }
            }
        }
    }
    let mut base: toml::Table = toml::from_str(config)?;
    let extra: toml::Table = toml::from_str(extra)?;
    merge(&mut base, extra);
    Ok(toml::to_string(&base)?)
}

/// The folder the benchmarks write their figures to: the workspace's `target/bench`.
pub fn out_dir() -> anyhow::Result<std::path::PathBuf> {
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&out)?;
    Ok(out)
}

/// Write `value` (pretty JSON) to `target/bench/<file>`.
pub fn write_json(file: &str, value: &serde_json::Value) -> anyhow::Result<()> {
    std::fs::write(out_dir()?.join(file), serde_json::to_string_pretty(value)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn extra_toml_merges_tables_and_replaces_keys() {
        let merged = super::merge_toml(
            "top = 1\n[publish]\npartitions = 6\n[kafka]\nbrokers = \"b\"\n",
            "[publish]\npartitions = 3\nmax_in_flight_bytes = 65536\n[kafka.properties]\n\"linger.ms\" = \"20\"\n",
        )
        .unwrap();
        let t: toml::Table = toml::from_str(&merged).unwrap();
        assert_eq!(t["top"].as_integer(), Some(1));
        assert_eq!(t["publish"]["partitions"].as_integer(), Some(3));
        assert_eq!(
            t["publish"]["max_in_flight_bytes"].as_integer(),
            Some(65536)
        );
        assert_eq!(t["kafka"]["brokers"].as_str(), Some("b"));
        assert_eq!(t["kafka"]["properties"]["linger.ms"].as_str(), Some("20"));
        assert!(super::merge_toml("a = 1", "[").is_err());
    }
}
