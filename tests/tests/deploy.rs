//! The deployment files (deploy/, docker-compose.yml) and the example configs they run.
//!
//! No container engine runs here, so the files are checked by their own checkers (hadolint, the
//! Compose specification's schema, the Kubernetes API schemas), checked against each other
//! (ports, paths, service names, the configs they carry), and the four binaries are run with
//! the same example configs and the compose file's environment against the local test bed:
//! MySQL -> ClickHouse through two apply-clickhouse instances of one group, MongoDB -> MongoDB,
//! every `/metrics` endpoint scraped and held to the naming scheme of docs/operations.md.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mongodb::bson::{doc, Document};
use mysql_async::prelude::Queryable;
use serde::Deserialize;
use serde_json::Value;
use sluice_tests::{
    bin, capture::scrape, clickhouse_url, free_port, is_mongo_java_server, kafka_brokers,
    mongo_source_url, mongo_target_url, mysql_url, replica_server_id, unique,
};

const BINARIES: [&str; 4] = [
    "capture-mysql",
    "capture-mongo",
    "apply-clickhouse",
    "apply-mongo",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The folder of the installed checkers (`deploy/testbed.sh tools` installs them once).
fn tools() -> PathBuf {
    let out = Command::new(repo().join("deploy/testbed.sh"))
        .arg("tools")
        .stderr(Stdio::inherit())
        .output()
        .expect("run deploy/testbed.sh tools");
    assert!(out.status.success(), "deploy/testbed.sh tools failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// `text` with `from` replaced by `to`: a fault for a checker to catch.
fn broken(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "{from:?} not found: the fault would not be made"
    );
    text.replace(from, to)
}

/// Run a checker: its success and everything it printed.
fn check(tool: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(tool)
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", tool.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Every document of a YAML file as JSON (read by the checkers' Python, which has PyYAML).
fn yaml(tools: &Path, rel: &str) -> Vec<Value> {
    let script = "import json, sys, yaml\n\
                  print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))";
    let out = Command::new(tools.join("python"))
        .args(["-c", script, repo().join(rel).to_str().unwrap()])
        .output()
        .expect("python of the checkers");
    assert!(
        out.status.success(),
        "{rel} is not valid YAML: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn config(binary: &str) -> toml::Table {
    read(&format!("deploy/config/{binary}.toml"))
        .parse()
        .unwrap_or_else(|e| panic!("deploy/config/{binary}.toml: {e}"))
}

/// The port of `[metrics] listen` in a binary's example config.
fn metrics_port(binary: &str) -> u16 {
    let listen = config(binary)["metrics"]["listen"]
        .as_str()
        .unwrap()
        .to_string();
    listen.rsplit(':').next().unwrap().parse().unwrap()
}

/// `binary --config deploy/config/<binary>.toml --print-config` with `env`: is the config,
/// with these overrides, one the binary accepts?
fn accepts(binary: &str, env: &[(String, String)]) -> Result<(), String> {
    let out = Command::new(bin(binary))
        .args([
            "--config",
            &format!("deploy/config/{binary}.toml"),
            "--print-config",
        ])
        .current_dir(repo())
        .env_clear()
        .envs(env.iter().cloned())
        .output()
        .unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

// ---------------------------------------------------------------------------------------------

#[test]
fn the_deployment_files_pass_their_checkers_and_the_checkers_catch_faults() {
    let tools = tools();
    let scratch = tempfile::tempdir().unwrap();

    let (ok, out) = check(&tools.join("hadolint"), &["deploy/Dockerfile"]);
    assert!(ok, "hadolint deploy/Dockerfile:\n{out}");
    let refused = |tool: &str, args: &[&str], file: &str, text: String| {
        let path = scratch.path().join(file);
        std::fs::write(&path, text).unwrap();
        let args = [args, &[path.to_str().unwrap()]].concat();
        check(&tools.join(tool), &args)
    };
    let (ok, out) = refused(
        "hadolint",
        &[],
        "Dockerfile",
        read("deploy/Dockerfile") + "USER root\n",
    );
    assert!(
        !ok && out.contains("DL3002"),
        "a last USER root must be refused:\n{out}"
    );

    let compose = ["--builtin-schema", "vendor.compose-spec"];
    let (ok, out) = check(
        &tools.join("check-jsonschema"),
        &[&compose[..], &["docker-compose.yml"]].concat(),
    );
    assert!(
        ok,
        "docker-compose.yml against the Compose specification:\n{out}"
    );
    let (ok, out) = refused(
        "check-jsonschema",
        &compose,
        "compose.yml",
        broken(
            &read("docker-compose.yml"),
            "  stop_grace_period:",
            "  stop_grace:",
        ),
    );
    assert!(!ok, "an unknown service key must be refused:\n{out}");

    let manifests: Vec<String> = std::fs::read_dir(repo().join("deploy/k8s"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| p.to_str().unwrap().to_string())
        .collect();
    assert!(manifests.len() >= 5, "{manifests:?}");
    let mut args = vec!["--strict", "--quiet"];
    args.extend(manifests.iter().map(String::as_str));
    let (ok, out) = check(&tools.join("kubernetes-validate"), &args);
    assert!(ok, "deploy/k8s against the Kubernetes schemas:\n{out}");
    let (ok, out) = refused(
        "kubernetes-validate",
        &["--strict", "--quiet"],
        "bad.yaml",
        broken(
            &read("deploy/k8s/apply-mongo.yaml"),
            "terminationGracePeriodSeconds:",
            "terminationGraceSeconds:",
        ),
    );
    assert!(!ok, "an unknown pod spec key must be refused:\n{out}");
}

/// The stages of the Dockerfile: name -> its lines (continuations joined).
fn dockerfile_stages() -> BTreeMap<String, Vec<String>> {
    let text = read("deploy/Dockerfile").replace("\\\n", " ");
    let mut stages: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current = String::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if let Some(from) = line.strip_prefix("FROM ") {
            current = from.rsplit(" AS ").next().unwrap().trim().to_string();
        }
        stages
            .entry(current.clone())
            .or_default()
            .push(line.to_string());
    }
    stages
}

#[test]
fn the_deployment_files_agree_with_each_other_and_with_the_example_configs() {
    let tools = tools();
    let version = env!("CARGO_PKG_VERSION");

    // Dockerfile: one runtime stage per binary, unprivileged, carrying its example config.
    let stages = dockerfile_stages();
    let runtime = &stages["runtime"];
    let user = runtime
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("the runtime stage sets USER");
    let uid: u32 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("a numeric USER");
    assert_ne!(uid, 0, "the images must not run as root");
    for b in BINARIES {
        let stage = stages
            .get(b)
            .unwrap_or_else(|| panic!("no Dockerfile stage {b}"));
        let has = |want: &str| stage.iter().any(|l| l.contains(want));
        assert!(stage[0].starts_with("FROM runtime AS"), "{b}: {stage:?}");
        assert!(!has("USER"), "{b} must keep the runtime's user");
        assert!(
            has(&format!(
                "COPY deploy/config/{b}.toml /etc/sluice/config.toml"
            )),
            "{b}"
        );
        assert!(
            has(&format!("EXPOSE {}", metrics_port(b))),
            "{b}: EXPOSE its metrics port"
        );
        assert!(
            has(&format!(
                "CMD [\"{b}\", \"--config\", \"/etc/sluice/config.toml\", \"--healthcheck\"]"
            )),
            "{b}: HEALTHCHECK"
        );
        assert!(
            stages["build"]
                .iter()
                .any(|l| l.contains(&format!("--bin {b}"))),
            "{b} built"
        );
    }
    // The operator command ships in the apply images.
    assert!(stages["build"].iter().any(|l| l.contains("--bin sluice ")));
    for b in ["apply-clickhouse", "apply-mongo"] {
        assert!(
            stages[b]
                .iter()
                .any(|l| l.starts_with("COPY --from=build") && l.contains("/out/sluice ")),
            "{b}: sluice in the image"
        );
    }

    // docker-compose.yml: the binaries run the mounted example configs; the overrides it sets
    // are keys the binaries accept; every server a config names is a service.
    let compose = yaml(&tools, "docker-compose.yml").remove(0);
    let services = compose["services"].as_object().unwrap();
    for b in BINARIES {
        let s = &services[b];
        assert_eq!(s["build"]["target"], b, "{b}: build target");
        assert_eq!(
            s["image"],
            format!("sluice/{b}:{version}"),
            "{b}: image tag"
        );
        let mount = format!("./deploy/config/{b}.toml:/etc/sluice/config.toml:ro");
        assert!(
            s["volumes"].as_array().unwrap().iter().any(|v| v == &mount),
            "{b}: {mount}"
        );
        let health = s["healthcheck"]["test"].to_string();
        assert!(
            health.contains("--healthcheck") && health.contains(b),
            "{b}: {health}"
        );
        assert!(
            s.get("container_name").is_none(),
            "{b}: a fixed name prevents scaling"
        );
        assert_eq!(s["read_only"], true, "{b}: read-only root file system");
        let env = compose_env(s);
        assert!(
            env.iter().all(|(k, _)| k.starts_with("SLUICE__")),
            "{b}: {env:?}"
        );
        accepts(b, &env).unwrap_or_else(|e| panic!("{b} refuses its compose environment: {e}"));
        for host in server_hosts(b) {
            assert!(
                services.contains_key(&host),
                "{b} names server {host}: not a service"
            );
            let waits = s["depends_on"].as_object().unwrap();
            assert!(waits.contains_key(&host), "{b} should wait for {host}");
        }
    }
    assert!(
        services["apply-clickhouse"].get("ports").is_none(),
        "apply-clickhouse publishes no host port, so that --scale can run several"
    );
    for s in [
        "mysql",
        "mongo",
        "kafka",
        "clickhouse",
        "prometheus",
        "grafana",
    ] {
        assert!(
            services[s].get("healthcheck").is_some(),
            "{s}: health check"
        );
    }
    let mysql_args = services["mysql"]["command"].to_string();
    for flag in [
        "--gtid-mode=ON",
        "--binlog-format=ROW",
        "--binlog-row-metadata=FULL",
    ] {
        assert!(mysql_args.contains(flag), "MySQL runs with {flag}");
    }
    assert!(services["mongo"]["command"]
        .to_string()
        .contains("--replSet"));
    assert_eq!(
        services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"], "broker,controller",
        "Kafka in KRaft mode"
    );

    // prometheus.yml: a job per binary, at its metrics port; apply-clickhouse by DNS, so that
    // every replica is scraped.
    let prometheus = yaml(&tools, "deploy/prometheus/prometheus.yml").remove(0);
    let jobs: BTreeMap<String, &Value> = prometheus["scrape_configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| (j["job_name"].as_str().unwrap().to_string(), j))
        .collect();
    for b in BINARIES {
        let job = jobs.get(b).unwrap_or_else(|| panic!("no scrape job {b}"));
        let port = metrics_port(b);
        let targets = job["static_configs"][0]["targets"].to_string();
        let by_dns = &job["dns_sd_configs"][0];
        assert!(
            targets.contains(&format!("\"{b}:{port}\""))
                || (by_dns["names"][0] == b && by_dns["port"] == port),
            "{b}: scrape job at port {port}: {job}"
        );
    }
    assert!(jobs["apply-clickhouse"].get("dns_sd_configs").is_some());

    // Grafana: the provisioned data source is the one the dashboard uses, the dashboards folder
    // is the one compose mounts, and the dashboard asks only for documented metrics, covering
    // throughput, lag (seconds and offsets), batches, errors and dead letters.
    let source = yaml(
        &tools,
        "deploy/grafana/provisioning/datasources/prometheus.yml",
    )
    .remove(0);
    let uid = source["datasources"][0]["uid"].as_str().unwrap();
    let provider = yaml(&tools, "deploy/grafana/provisioning/dashboards/sluice.yml").remove(0);
    let path = provider["providers"][0]["options"]["path"]
        .as_str()
        .unwrap();
    let grafana_volumes = services["grafana"]["volumes"].to_string();
    assert!(
        grafana_volumes.contains(&format!("./deploy/grafana/dashboards:{path}")),
        "{grafana_volumes}"
    );
    assert!(grafana_volumes.contains("./deploy/grafana/provisioning:/etc/grafana/provisioning"));
    let dashboard: Value =
        serde_json::from_str(&read("deploy/grafana/dashboards/sluice.json")).unwrap();
    let documented = documented_metrics();
    let mut asked = BTreeSet::new();
    // Each panel shows data for every binary its row names (a deployment of only one of
    // them included): at least one of its expressions asks only for metrics that binary's
    // own docs list (docs/<binary>.md), or the process's.
    let mut row_binaries: Vec<String> = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            let title = panel["title"].as_str().unwrap();
            row_binaries = BINARIES
                .iter()
                .filter(|b| title.contains(*b))
                .map(|b| b.to_string())
                .collect();
            continue;
        }
        for b in &row_binaries {
            let own = metric_names_in(&read(&format!("docs/{b}.md")));
            let shows = panel["targets"].as_array().unwrap().iter().any(|t| {
                metric_names_in(t["expr"].as_str().unwrap())
                    .iter()
                    .all(|n| n.starts_with("process_") || own.contains(n))
            });
            assert!(
                shows,
                "panel {} shows nothing for a deployment of {b}: none of its expressions asks \
                 only for metrics docs/{b}.md lists",
                panel["title"]
            );
        }
        assert_eq!(panel["datasource"]["uid"], uid, "panel {}", panel["title"]);
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for name in metric_names_in(expr) {
                assert!(
                    name.starts_with("process_") || documented.contains(&name),
                    "panel {}: {name} is not a documented metric",
                    panel["title"]
                );
                asked.insert(name);
            }
        }
    }
    for needed in [
        "sluice_capture_events_total",
        "sluice_capture_lag_seconds",
        "sluice_capture_errors_total",
        "sluice_apply_rows_total",
        "sluice_apply_consumer_lag_messages",
        "sluice_apply_end_to_end_latency_seconds",
        "sluice_apply_batch_rows",
        "sluice_apply_batch_duration_seconds",
        "sluice_apply_dead_letters_total",
    ] {
        assert!(asked.contains(needed), "the dashboard shows no {needed}");
    }

    // Kubernetes: each stage's ConfigMap is its example config, unchanged; the Deployment runs
    // the image of this version, unprivileged, at the config's port, with overrides the binary
    // accepts; a capture never runs twice.
    let secret = yaml(&tools, "deploy/k8s/secret.yaml").remove(0);
    for b in BINARIES {
        let rel = format!("deploy/k8s/{b}.yaml");
        let docs = yaml(&tools, &rel);
        let of = |kind: &str| {
            docs.iter()
                .find(|d| d["kind"] == kind)
                .unwrap_or_else(|| panic!("{rel}: no {kind}"))
        };
        assert_eq!(
            of("ConfigMap")["data"]["config.toml"].as_str().unwrap(),
            read(&format!("deploy/config/{b}.toml")),
            "{rel}: the ConfigMap must hold deploy/config/{b}.toml unchanged (copy it in)"
        );
        let deployment = of("Deployment");
        let pod = &deployment["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        assert_eq!(container["image"], format!("sluice/{b}:{version}"), "{rel}");
        assert_eq!(
            container["ports"][0]["containerPort"],
            metrics_port(b),
            "{rel}"
        );
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{rel}");
        // Liveness asks only that the process serves; readiness whether it is healthy (a
        // stage waiting for its target is degraded, and must not be restarted for it).
        assert_eq!(
            container["livenessProbe"]["httpGet"]["path"], "/livez",
            "{rel}"
        );
        assert_eq!(
            container["readinessProbe"]["httpGet"]["path"], "/healthz",
            "{rel}"
        );
        assert_eq!(pod["volumes"][0]["configMap"]["name"], b, "{rel}");
        assert_eq!(
            container["volumeMounts"][0]["mountPath"], "/etc/sluice",
            "{rel}"
        );
        // Every stage keeps one pod through a voluntary disruption.
        let pdb = &of("PodDisruptionBudget")["spec"];
        assert_eq!(
            pdb["selector"]["matchLabels"]["app.kubernetes.io/name"], b,
            "{rel}"
        );
        if b.starts_with("capture") {
            // A standby pair: two pods, one active, elected; never both gone at once.
            assert_eq!(deployment["spec"]["replicas"], 2, "{rel}: a standby pair");
            assert_eq!(pdb["minAvailable"], 1, "{rel}");
            assert_eq!(
                deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 0,
                "{rel}"
            );
            let env = container["env"].as_array().unwrap();
            let var = |name: &str| env.iter().find(|e| e["name"] == name).cloned();
            assert_eq!(
                var("SLUICE__STANDBY__ENABLED").map(|e| e["value"].clone()),
                Some("true".into()),
                "{rel}: the pair elects its active one"
            );
            assert_eq!(
                var("SLUICE__STANDBY__INSTANCE")
                    .map(|e| e["valueFrom"]["fieldRef"]["fieldPath"].clone()),
                Some("metadata.name".into()),
                "{rel}: each pod's name is its instance's"
            );
        } else {
            // Scaled on consumer lag, never past what the Deployment's own count starts with.
            let hpa = &of("HorizontalPodAutoscaler")["spec"];
            assert_eq!(hpa["scaleTargetRef"]["name"], b, "{rel}");
            assert_eq!(
                hpa["metrics"][0]["external"]["metric"]["name"],
                "sluice_apply_consumer_lag_messages",
                "{rel}"
            );
            assert!(
                hpa["minReplicas"].as_i64() <= deployment["spec"]["replicas"].as_i64(),
                "{rel}"
            );
        }
        assert_eq!(
            of("Service")["spec"]["ports"][0]["port"],
            metrics_port(b),
            "{rel}"
        );
        let env: Vec<(String, String)> = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let value = match e.get("value") {
                    Some(v) => v.as_str().unwrap().to_string(),
                    // The pod's own fields (its name): any string stands in.
                    None if e["valueFrom"].get("fieldRef").is_some() => {
                        format!(
                            "from-{}",
                            e["valueFrom"]["fieldRef"]["fieldPath"].as_str().unwrap()
                        )
                    }
                    None => {
                        let key = e["valueFrom"]["secretKeyRef"]["key"].as_str().unwrap();
                        secret["stringData"][key]
                            .as_str()
                            .unwrap_or_else(|| panic!("{rel}: secret key {key} not in secret.yaml"))
                            .to_string()
                    }
                };
                (e["name"].as_str().unwrap().to_string(), value)
            })
            .collect();
        accepts(b, &env).unwrap_or_else(|e| panic!("{b} refuses the environment of {rel}: {e}"));
    }
}

/// A compose service's `environment` (a map or a list of `K=V`).
fn compose_env(service: &Value) -> Vec<(String, String)> {
    match service.get("environment") {
        None => vec![],
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.as_str().map(str::to_string).unwrap_or(v.to_string()),
                )
            })
            .collect(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|kv| {
                let (k, v) = kv.as_str().unwrap().split_once('=').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect(),
        Some(other) => panic!("environment: {other}"),
    }
}

/// The host names of the servers a binary's example config connects to.
fn server_hosts(binary: &str) -> Vec<String> {
    let c = config(binary);
    let urls = match binary {
        "capture-mysql" => vec![c["mysql"]["url"].as_str().unwrap()],
        "capture-mongo" | "apply-mongo" => vec![c["mongodb"]["uri"].as_str().unwrap()],
        "apply-clickhouse" => vec![c["clickhouse"]["url"].as_str().unwrap()],
        _ => unreachable!(),
    };
    let mut hosts: Vec<String> = urls
        .into_iter()
        .map(|u| {
            let rest = u.split_once("://").unwrap().1;
            let rest = rest.rsplit_once('@').map(|(_, h)| h).unwrap_or(rest);
            rest.split([':', '/', '?']).next().unwrap().to_string()
        })
        .collect();
    let brokers = c["kafka"]["brokers"].as_str().unwrap();
    hosts.extend(
        brokers
            .split(',')
            .map(|b| b.split(':').next().unwrap().to_string()),
    );
    hosts
}

/// Every `sluice_*` metric name the docs mention.
fn documented_metrics() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(repo().join("docs")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        names.extend(
            metric_names_in(&text)
                .into_iter()
                .filter(|n| n.starts_with("sluice_")),
        );
    }
    names
}

/// Metric names in a text (PromQL or docs); a histogram's series suffixes dropped.
fn metric_names_in(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        let starts_word = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        if starts_word && (rest.starts_with("sluice_") || rest.starts_with("process_")) {
            let len = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(rest.len());
            let mut name = &rest[..len];
            for suffix in ["_bucket", "_sum", "_count"] {
                name = name.strip_suffix(suffix).unwrap_or(name);
            }
            names.insert(name.trim_end_matches('_').to_string());
            i += len;
        } else {
            i += rest.chars().next().unwrap().len_utf8();
        }
    }
    names
}

// ---------------------------------------------------------------------------------------------
// The scheme of docs/operations.md#metrics.

/// The label names docs/operations.md allows (its "Label names:" line).
fn allowed_labels() -> BTreeSet<String> {
    let ops = read("docs/operations.md");
    let line = ops
        .lines()
        .find(|l| l.starts_with("Label names:"))
        .expect("docs/operations.md has a `Label names:` line");
    line.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// Problems of one `/metrics` page against the scheme; `binary` must be its build_info label.
fn scheme_faults(
    binary: &str,
    page: &str,
    labels: &BTreeSet<String>,
    documented: &BTreeSet<String>,
) -> Vec<String> {
    let stage = binary.split('-').next().unwrap();
    let mut faults = Vec::new();
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    for line in page.lines() {
        if let Some(t) = line.strip_prefix("# TYPE ") {
            let (name, kind) = t.split_once(' ').unwrap();
            types.insert(name.to_string(), kind.to_string());
        }
    }
    for (name, kind) in &types {
        if name.starts_with("process_") {
            continue;
        }
        if name == "sluice_build_info" {
            continue;
        }
        if !name.starts_with(&format!("sluice_{stage}_")) {
            faults.push(format!("{name}: not sluice_{stage}_<name>_<unit>"));
        }
        if !documented.contains(name) {
            faults.push(format!("{name}: not in docs/"));
        }
        match kind.as_str() {
            "counter" if !name.ends_with("_total") => {
                faults.push(format!("{name}: a counter must end in _total"))
            }
            "gauge" | "histogram" if name.ends_with("_total") => {
                faults.push(format!("{name}: only counters end in _total"))
            }
            "histogram"
                if !["_seconds", "_bytes", "_rows"]
                    .iter()
                    .any(|u| name.ends_with(u)) =>
            {
                faults.push(format!("{name}: a histogram names its unit"))
            }
            _ => {}
        }
    }
    let mut build_info = false;
    for line in page
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, _) = line.rsplit_once(' ').unwrap();
        let (name, label_text) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        for pair in label_text.split("\",").filter(|p| !p.is_empty()) {
            let label = pair.split('=').next().unwrap();
            if !labels.contains(label) {
                faults.push(format!(
                    "{name}: label {label} is not in the documented set"
                ));
            }
        }
        if name == "sluice_build_info" {
            build_info = label_text.contains(&format!("binary=\"{binary}\""));
        }
    }
    if !build_info {
        faults.push(format!("no sluice_build_info{{binary=\"{binary}\"}}"));
    }
    faults.sort();
    faults.dedup();
    faults
}

/// The alert rules (deploy/prometheus/alerts.yml) pass their promtool unit tests
/// (alerts_test.yml: each alert fires on the series that should raise it, and not before), ask
/// only for documented metrics, cover what stops making progress, and are loaded by the compose
/// stack's Prometheus; promtool catches a rule that no longer fires.
#[test]
fn the_alert_rules_pass_their_promtool_tests_and_name_documented_metrics() {
    let tools = tools();
    let promtool = tools.join("promtool");
    let (ok, out) = check(
        &promtool,
        &["test", "rules", "deploy/prometheus/alerts_test.yml"],
    );
    assert!(ok, "promtool test rules:\n{out}");
    let rules = yaml(&tools, "deploy/prometheus/alerts.yml").remove(0);
    let documented = documented_metrics();
    let mut alerts = BTreeSet::new();
    for r in rules["groups"][0]["rules"].as_array().unwrap() {
        let expr = r["expr"].as_str().unwrap();
        for name in metric_names_in(expr) {
            assert!(
                name == "up" || name.starts_with("process_") || documented.contains(&name),
                "alert {}: {name} is not a documented metric",
                r["alert"]
            );
        }
        alerts.insert(r["alert"].as_str().unwrap().to_string());
    }
    for needed in [
        "SluiceProcessDown",
        "SluiceProcessRestarting",
        "SluiceCaptureBehind",
        "SluiceApplyBehind",
        "SluiceUnheldPartitions",
        "SluiceTableStopped",
        "SluiceDeadLetters",
    ] {
        assert!(alerts.contains(needed), "no alert {needed}: {alerts:?}");
    }
    let prometheus = yaml(&tools, "deploy/prometheus/prometheus.yml").remove(0);
    assert_eq!(prometheus["rule_files"][0], "alerts.yml");
    let compose = yaml(&tools, "docker-compose.yml").remove(0);
    assert!(compose["services"]["prometheus"]["volumes"]
        .to_string()
        .contains("./deploy/prometheus/alerts.yml:/etc/prometheus/alerts.yml"));
    // A rule changed so that it no longer fires: its test fails.
    let dir = tempfile::tempdir().unwrap();
    let rules_text = read("deploy/prometheus/alerts.yml");
    std::fs::write(
        dir.path().join("alerts.yml"),
        broken(
            &rules_text,
            "sluice_apply_stopped_tables) > 0",
            "sluice_apply_stopped_tables) > 5",
        ),
    )
    .unwrap();
    std::fs::copy(
        repo().join("deploy/prometheus/alerts_test.yml"),
        dir.path().join("alerts_test.yml"),
    )
    .unwrap();
    let out = Command::new(&promtool)
        .args(["test", "rules", "alerts_test.yml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "promtool passed a rule that no longer fires: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn the_scheme_check_catches_a_misnamed_metric() {
    let labels = allowed_labels();
    let documented: BTreeSet<String> = ["sluice_apply_rows_total".to_string()].into();
    let good = "# TYPE sluice_build_info gauge\nsluice_build_info{binary=\"apply-mongo\",version=\"1\"} 1\n\
                # TYPE sluice_apply_rows_total counter\nsluice_apply_rows_total{table=\"t\"} 3\n";
    assert_eq!(
        scheme_faults("apply-mongo", good, &labels, &documented),
        Vec::<String>::new()
    );
    let bad = format!(
        "{good}# TYPE sluice_apply_rows counter\nsluice_apply_rows{{row_key=\"7\"}} 1\n\
         # TYPE sluice_capture_lag_total gauge\nsluice_capture_lag_total 1\n"
    );
    let faults = scheme_faults("apply-mongo", &bad, &labels, &documented);
    for want in [
        "sluice_apply_rows: a counter must end in _total",
        "sluice_apply_rows: label row_key is not in the documented set",
        "sluice_capture_lag_total: not sluice_apply_<name>_<unit>",
        "sluice_capture_lag_total: only counters end in _total",
        "sluice_capture_lag_total: not in docs/",
    ] {
        assert!(
            faults.iter().any(|f| f == want),
            "{want} missing from {faults:?}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The binaries with the example configs, against the test bed.

/// A binary run with its example config and environment overrides.
struct Stage {
    binary: &'static str,
    env: Vec<(String, String)>,
    port: u16,
    child: Child,
}

impl Stage {
    /// `compose` is the docker-compose.yml service's environment; `local` points the example
    /// config at the test bed and at this test's own names.
    fn start(binary: &'static str, compose: &Value, local: &[(&str, String)]) -> Stage {
        let port = free_port();
        let mut env = compose_env(&compose["services"][binary]);
        env.extend(local.iter().map(|(k, v)| (k.to_string(), v.clone())));
        env.push(("SLUICE__KAFKA__BROKERS".into(), kafka_brokers()));
        env.push((
            "SLUICE__METRICS__LISTEN".into(),
            format!("127.0.0.1:{port}"),
        ));
        let child = Command::new(bin(binary))
            .args(["--config", &format!("deploy/config/{binary}.toml")])
            .current_dir(repo())
            .envs(env.iter().cloned())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Stage {
            binary,
            env,
            port,
            child,
        }
    }

    /// `--healthcheck` with the same config and environment: its exit code.
    fn healthcheck(&self) -> Option<i32> {
        Command::new(bin(self.binary))
            .args([
                "--config",
                &format!("deploy/config/{}.toml", self.binary),
                "--healthcheck",
            ])
            .current_dir(repo())
            .envs(self.env.iter().cloned())
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .code()
    }

    fn metric(&self, name: &str) -> f64 {
        sluice_tests::capture::metric_at(self.port, name).unwrap_or(0.0)
    }

    /// SIGTERM; the exit code and the log.
    fn stop(&mut self) -> (Option<i32>, String) {
        use std::io::Read;
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break self.child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut log = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut log);
        }
        (status.code(), log)
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn logs_of(stages: &mut [&mut Stage]) -> String {
    stages
        .iter_mut()
        .map(|s| {
            let log = s.stop().1;
            format!("--- {} ---\n{log}", s.binary)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[derive(Debug, PartialEq, Eq, Deserialize, clickhouse::Row)]
struct Order {
    id: u64,
    customer: String,
    cents: i64,
    status: String,
}

async fn source_orders(c: &mut mysql_async::Conn, db: &str) -> Vec<Order> {
    c.query_map(
        format!("SELECT id, customer, CAST(amount * 100 AS SIGNED), CAST(status AS CHAR) FROM {db}.orders ORDER BY id"),
        |(id, customer, cents, status)| Order { id, customer, cents, status },
    )
    .await
    .unwrap()
}

async fn mirror_orders(ch: &clickhouse::Client, ch_db: &str) -> Vec<Order> {
    ch.query(&format!(
        "SELECT id, customer, toInt64(amount * 100) AS cents, toString(status) AS status \
         FROM {ch_db}.orders FINAL WHERE _deleted = 0 ORDER BY id"
    ))
    .fetch_all()
    .await
    .unwrap_or_default()
}

async fn documents(c: &mongodb::Client, db: &str) -> Vec<Document> {
    use futures::TryStreamExt;
    c.database(db)
        .collection::<Document>("customers")
        .find(doc! {})
        .sort(doc! { "_id": 1 })
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

/// `Ok` when `got` is `want`; otherwise what was got.
fn same<T: PartialEq + std::fmt::Debug>(got: T, want: &T) -> Result<(), String> {
    if got == *want {
        Ok(())
    } else {
        Err(format!("{got:?}"))
    }
}

/// Wait until `done` holds, checking every 300 ms; on time out, stop every stage and fail with
/// their logs.
async fn until<F, Fut>(what: &str, limit: Duration, stages: &mut [&mut Stage], mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        let state = done().await;
        if state.is_ok() {
            return;
        }
        if Instant::now() > deadline {
            panic!(
                "{what} not within {limit:?}: {}\n{}",
                state.unwrap_err(),
                logs_of(stages)
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_example_configs_run_the_pipeline_with_two_clickhouse_appliers() {
    let tools = tools();
    let compose = yaml(&tools, "docker-compose.yml").remove(0);
    let partitions = 4;

    // MySQL: the stack's init script's table and rows, in a database of this test's own.
    let db = unique("deploy");
    let mut my = mysql_async::Conn::new(mysql_async::Opts::from_url(&mysql_url()).unwrap())
        .await
        .unwrap();
    let init = read("deploy/compose/mysql-init.sql");
    let shop = &init[init
        .find("CREATE DATABASE")
        .expect("mysql-init.sql creates shop")..];
    my.query_drop(shop.replace("shop", &db)).await.unwrap();
    let ch = clickhouse::Client::default()
        .with_url(clickhouse_url())
        .with_validation(false);
    let ch_db = unique("deploy_ch");
    ch.query(&format!("CREATE DATABASE {ch_db}"))
        .execute()
        .await
        .unwrap();

    // MongoDB: three documents before the capture starts.
    let mdb = unique("deploy_m");
    let source = mongodb::Client::with_uri_str(mongo_source_url())
        .await
        .unwrap();
    let target = mongodb::Client::with_uri_str(mongo_target_url())
        .await
        .unwrap();
    let customers = source.database(&mdb).collection::<Document>("customers");
    customers
        .insert_many((0..3).map(|i| doc! { "_id": i, "name": format!("c{i}"), "tier": "gold" }))
        .await
        .unwrap();

    let mysql_prefix = unique("mysql");
    let mongo_prefix = unique("mongo");
    let regex = |p: &str| format!("[\"^{p}\\\\..*\"]");
    let mut capture_mysql = Stage::start(
        "capture-mysql",
        &compose,
        &[
            ("SLUICE__MYSQL__URL", mysql_url()),
            ("SLUICE__MYSQL__SERVER_ID", replica_server_id().to_string()),
            ("SLUICE__CONNECTOR", unique("deploy_conn")),
            ("SLUICE__FILTER__INCLUDE", format!("[\"{db}\\\\..*\"]")),
            ("SLUICE__TOPICS__PREFIX", mysql_prefix.clone()),
            ("SLUICE__PUBLISH__PARTITIONS", partitions.to_string()),
        ],
    );
    // mongo-java-server serves change streams on one collection only (docs/testbed.md); a real
    // MongoDB runs the example's whole-cluster stream.
    let mut mongo_scope = vec![];
    if is_mongo_java_server(&source).await {
        mongo_scope.push(("SLUICE__MONGODB__DATABASE", mdb.clone()));
        mongo_scope.push(("SLUICE__MONGODB__COLLECTION", "customers".to_string()));
    }
    let mut capture_mongo = Stage::start(
        "capture-mongo",
        &compose,
        &[
            &mongo_scope[..],
            &[
                ("SLUICE__MONGODB__URI", mongo_source_url()),
                ("SLUICE__CONNECTOR", unique("deploy_mconn")),
                ("SLUICE__FILTER__INCLUDE", format!("[\"{mdb}\\\\..*\"]")),
                ("SLUICE__TOPICS__PREFIX", mongo_prefix.clone()),
                ("SLUICE__PUBLISH__PARTITIONS", "2".into()),
            ],
        ]
        .concat(),
    );
    let group = unique("deploy_g");
    let apply_ch = |_: ()| {
        Stage::start(
            "apply-clickhouse",
            &compose,
            &[
                ("SLUICE__CLICKHOUSE__URL", clickhouse_url()),
                ("SLUICE__CLICKHOUSE__DATABASE", ch_db.clone()),
                ("SLUICE__CONSUMER__GROUP_ID", group.clone()),
                ("SLUICE__CONSUMER__TOPICS", regex(&mysql_prefix)),
            ],
        )
    };
    let mut apply_a = apply_ch(());
    let mut apply_mongo = Stage::start(
        "apply-mongo",
        &compose,
        &[
            ("SLUICE__MONGODB__URI", mongo_target_url()),
            ("SLUICE__CONSUMER__GROUP_ID", unique("deploy_mg")),
            ("SLUICE__CONSUMER__TOPICS", regex(&mongo_prefix)),
        ],
    );

    // The snapshots (the compose file runs both captures with snapshot+stream).
    let want = source_orders(&mut my, &db).await;
    assert_eq!(want.len(), 3);
    {
        let mut stages = [
            &mut capture_mysql,
            &mut capture_mongo,
            &mut apply_a,
            &mut apply_mongo,
        ];
        until(
            "the MySQL snapshot in ClickHouse",
            Duration::from_secs(120),
            &mut stages,
            || async { same(mirror_orders(&ch, &ch_db).await, &want) },
        )
        .await;
        let want = documents(&source, &mdb).await;
        until(
            "the MongoDB snapshot in the target",
            Duration::from_secs(120),
            &mut stages,
            || async { same(documents(&target, &mdb).await, &want) },
        )
        .await;
    }

    // A second apply-clickhouse joins the group; both hold partitions before the changes.
    let mut apply_b = apply_ch(());
    {
        let mut stages = [
            &mut capture_mysql,
            &mut capture_mongo,
            &mut apply_a,
            &mut apply_b,
            &mut apply_mongo,
        ];
        let (pa, pb) = (stages[2].port, stages[3].port);
        until(
            "both appliers holding partitions",
            Duration::from_secs(60),
            &mut stages,
            || async move {
                let held = |port| {
                    sluice_tests::capture::metric_at(port, "sluice_apply_assigned_partitions")
                        .unwrap_or(0.0)
                };
                let (a, b) = (held(pa), held(pb));
                if a > 0.0 && b > 0.0 && a + b == partitions as f64 {
                    Ok(())
                } else {
                    Err(format!("{a} + {b} partitions"))
                }
            },
        )
        .await;
    }
    let rows_before_b = apply_a.metric("sluice_apply_rows_total");

    // Changes: inserts, updates, deletes in MySQL; inserts and a delete in MongoDB.
    for batch in 0..4 {
        let values: Vec<String> = (0..50)
            .map(|i| format!("('c{}', {}.{:02}, 'new')", batch * 50 + i, i, i))
            .collect();
        my.query_drop(format!(
            "INSERT INTO {db}.orders (customer, amount, status) VALUES {}",
            values.join(",")
        ))
        .await
        .unwrap();
    }
    my.query_drop(format!(
        "UPDATE {db}.orders SET status = 'paid', amount = amount + 1 WHERE id % 7 = 0"
    ))
    .await
    .unwrap();
    my.query_drop(format!("DELETE FROM {db}.orders WHERE id % 11 = 0"))
        .await
        .unwrap();
    customers
        .insert_many((3..53).map(|i| doc! { "_id": i, "name": format!("c{i}"), "tier": "silver" }))
        .await
        .unwrap();
    customers.delete_one(doc! { "_id": 1 }).await.unwrap();

    let want = source_orders(&mut my, &db).await;
    assert!(want.len() > 150, "{} rows", want.len());
    let want_docs = documents(&source, &mdb).await;
    assert_eq!(want_docs.len(), 52);
    {
        let mut stages = [
            &mut capture_mysql,
            &mut capture_mongo,
            &mut apply_a,
            &mut apply_b,
            &mut apply_mongo,
        ];
        until(
            "the MySQL changes in ClickHouse",
            Duration::from_secs(120),
            &mut stages,
            || async {
                let got = mirror_orders(&ch, &ch_db).await;
                if got == want {
                    Ok(())
                } else {
                    Err(format!(
                        "{} of {} rows equal",
                        got.iter().filter(|r| want.contains(r)).count(),
                        want.len()
                    ))
                }
            },
        )
        .await;
        until(
            "the MongoDB changes in the target",
            Duration::from_secs(120),
            &mut stages,
            || async {
                let got = documents(&target, &mdb).await;
                if got == want_docs {
                    Ok(())
                } else {
                    Err(format!("{} documents", got.len()))
                }
            },
        )
        .await;
    }
    let (a, b) = (
        apply_a.metric("sluice_apply_rows_total") - rows_before_b,
        apply_b.metric("sluice_apply_rows_total"),
    );
    assert!(
        a > 0.0 && b > 0.0,
        "both appliers write the changes: {a} + {b} rows"
    );

    // Every process: healthy by its own --healthcheck, and its /metrics in the scheme.
    let labels = allowed_labels();
    let documented = documented_metrics();
    let stages = [
        &capture_mysql,
        &capture_mongo,
        &apply_a,
        &apply_b,
        &apply_mongo,
    ];
    let mut faults = Vec::new();
    for s in stages {
        assert_eq!(
            s.healthcheck(),
            Some(0),
            "{} --healthcheck while it runs",
            s.binary
        );
        let page = scrape(s.port).expect("a /metrics page");
        let body = page.split("\r\n\r\n").nth(1).unwrap_or("");
        faults.extend(
            scheme_faults(s.binary, body, &labels, &documented)
                .into_iter()
                .map(|f| format!("{}: {f}", s.binary)),
        );
    }
    assert!(
        faults.is_empty(),
        "metrics outside docs/operations.md#metrics:\n{}",
        faults.join("\n")
    );

    // SIGTERM: each stops cleanly; then --healthcheck says it is down.
    for s in [
        &mut capture_mysql,
        &mut capture_mongo,
        &mut apply_a,
        &mut apply_b,
        &mut apply_mongo,
    ] {
        let (code, log) = s.stop();
        assert_eq!(code, Some(0), "{} on SIGTERM:\n{log}", s.binary);
    }
    assert_eq!(
        apply_b.healthcheck(),
        Some(1),
        "--healthcheck of a stopped process"
    );

    my.query_drop(format!("DROP DATABASE {db}")).await.unwrap();
    ch.query(&format!("DROP DATABASE {ch_db}"))
        .execute()
        .await
        .unwrap();
    source.database(&mdb).drop().await.unwrap();
    target.database(&mdb).drop().await.unwrap();
}
