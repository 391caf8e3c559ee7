// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//! `vhost-user-crypto-stats PATH`: reads the object the daemon's stats
//! socket (`--stats-socket PATH`) gives one connection and prints it as a
//! table, as indented JSON (`--json`), or in the Prometheus text
//! exposition format (`--prometheus`: one counter per field, labelled
//! with the queue, and the status for the status counts). The fields are
//! in the daemon's `docs/OPERATING.md`.

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde_json::Value;

/// Prints a vhost-user-crypto daemon's counters (its --stats-socket).
#[derive(Debug, Parser)]
#[command(name = "vhost-user-crypto-stats", version)]
struct Args {
    /// The daemon's stats socket.
    path: PathBuf,
    /// Prometheus text exposition format instead of a table.
    #[arg(long, conflicts_with = "json")]
    prometheus: bool,
    /// The object as indented JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// The per-queue counters, in table order (`status` is expanded).
const COUNTERS: [&str; 5] = ["requests", "bytes_in", "bytes_out", "batches", "notifications"];
/// The status counts, in table order.
const STATUSES: [&str; 5] = ["ok", "err", "badmsg", "notsupp", "invsess"];
/// Prefix of the Prometheus metric names.
const PREFIX: &str = "vhost_user_crypto";

fn main() -> ExitCode {
    let args = Args::parse();
    match read(&args) {
        Ok(v) => {
            if args.prometheus {
                print!("{}", prometheus(&v));
            } else if args.json {
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            } else {
                print!("{}", table(&v));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vhost-user-crypto-stats: {}: {e}", args.path.display());
            ExitCode::FAILURE
        }
    }
}

/// The object, read to EOF (5 s at most).
fn read(args: &Args) -> Result<Value, String> {
    let mut s = UnixStream::connect(&args.path).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut b = Vec::new();
    s.read_to_end(&mut b).map_err(|e| e.to_string())?;
    serde_json::from_slice(&b).map_err(|e| format!("not the stats object: {e}"))
}

/// A number field of `v` as text ("-" when missing).
fn num(v: &Value, key: &str) -> String {
    match &v[key] {
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => u8::from(*b).to_string(),
        _ => "-".into(),
    }
}

/// A counter column's width: its name's, and at least 10.
fn width(name: &str) -> usize {
    name.len().max(10)
}

/// One table row: `name`, then the counters of `q`.
fn row(name: &str, q: &Value) -> String {
    let mut cells = vec![format!("{name:>5}")];
    cells.extend(
        COUNTERS
            .iter()
            .map(|k| format!("{:>w$}", num(q, k), w = width(k))),
    );
    cells.extend(STATUSES.iter().map(|k| format!("{:>8}", num(&q["status"], k))));
    cells.push(format!("{:>11}", num(q, "throttled_s")));
    cells.join(" ") + "\n"
}

fn table(v: &Value) -> String {
    let s = &v["sessions"];
    let mut out = format!(
        "uptime {} s, frontend connected: {}\nsessions: live {}, created {}, closed {}, create_failed {}, dropped {}\n\n",
        num(v, "uptime_s"),
        v["frontend_connected"],
        num(s, "live"),
        num(s, "created"),
        num(s, "closed"),
        num(s, "create_failed"),
        num(s, "dropped"),
    );
    let mut head = vec![format!("{:>5}", "queue")];
    head.extend(COUNTERS.iter().map(|k| format!("{k:>w$}", w = width(k))));
    head.extend(STATUSES.iter().map(|k| format!("{k:>8}")));
    head.push(format!("{:>11}", "throttled_s"));
    out += &(head.join(" ") + "\n");
    for q in v["queues"].as_array().into_iter().flatten() {
        out += &row(&num(q, "index"), q);
    }
    out + &row("total", &v["totals"])
}

/// Appends one metric's `# TYPE` line and its samples.
fn metric(out: &mut String, name: &str, kind: &str, samples: &[(String, String)]) {
    out.push_str(&format!("# TYPE {PREFIX}_{name} {kind}\n"));
    for (labels, value) in samples {
        out.push_str(&format!("{PREFIX}_{name}{labels} {value}\n"));
    }
}

fn prometheus(v: &Value) -> String {
    let mut out = String::new();
    let one = |x: String| [(String::new(), x)];
    metric(&mut out, "uptime_seconds", "gauge", &one(num(v, "uptime_s")));
    metric(
        &mut out,
        "frontend_connected",
        "gauge",
        &one(num(v, "frontend_connected")),
    );
    let s = &v["sessions"];
    metric(&mut out, "sessions_live", "gauge", &one(num(s, "live")));
    for k in ["created", "closed", "create_failed", "dropped"] {
        metric(
            &mut out,
            &format!("sessions_{k}_total"),
            "counter",
            &one(num(s, k)),
        );
    }
    let queues: Vec<&Value> = v["queues"].as_array().into_iter().flatten().collect();
    let label = |q: &Value| format!("{{queue=\"{}\"}}", num(q, "index"));
    for k in COUNTERS {
        let samples: Vec<_> = queues.iter().map(|q| (label(q), num(q, k))).collect();
        metric(&mut out, &format!("{k}_total"), "counter", &samples);
    }
    let samples: Vec<_> = queues
        .iter()
        .flat_map(|q| {
            STATUSES.iter().map(move |st| {
                (
                    format!("{{queue=\"{}\",status=\"{st}\"}}", num(q, "index")),
                    num(&q["status"], st),
                )
            })
        })
        .collect();
    metric(&mut out, "status_total", "counter", &samples);
    let samples: Vec<_> = queues.iter().map(|q| (label(q), num(q, "throttled_s"))).collect();
    metric(&mut out, "throttled_seconds_total", "counter", &samples);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object() -> Value {
        serde_json::json!({
            "uptime_s": 2.5,
            "frontend_connected": true,
            "sessions": {"live": 1, "created": 3, "closed": 1, "create_failed": 0, "dropped": 1},
            "totals": {"requests": 7, "bytes_in": 64, "bytes_out": 64,
                "status": {"ok": 1, "err": 0, "badmsg": 0, "notsupp": 0, "invsess": 6},
                "batches": 2, "notifications": 2, "throttled_s": 0.25},
            "queues": [{"index": 0, "requests": 7, "bytes_in": 64, "bytes_out": 64,
                "status": {"ok": 1, "err": 0, "badmsg": 0, "notsupp": 0, "invsess": 6},
                "batches": 2, "notifications": 2, "throttled_s": 0.25}],
        })
    }

    #[test]
    fn prometheus_has_one_labelled_counter_per_field() {
        let p = prometheus(&object());
        for line in [
            "# TYPE vhost_user_crypto_requests_total counter",
            "vhost_user_crypto_requests_total{queue=\"0\"} 7",
            "vhost_user_crypto_status_total{queue=\"0\",status=\"invsess\"} 6",
            "vhost_user_crypto_throttled_seconds_total{queue=\"0\"} 0.25",
            "vhost_user_crypto_sessions_live 1",
            "vhost_user_crypto_frontend_connected 1",
            "vhost_user_crypto_uptime_seconds 2.5",
        ] {
            assert!(p.lines().any(|l| l == line), "{line:?} in\n{p}");
        }
        // Every sample line is `name{labels} value`, the value a number.
        for l in p.lines().filter(|l| !l.starts_with('#')) {
            let (_, value) = l.rsplit_once(' ').unwrap();
            value.parse::<f64>().unwrap_or_else(|_| panic!("{l}"));
        }
    }

    #[test]
    fn table_has_a_row_per_queue_and_the_totals() {
        let t = table(&object());
        let rows: Vec<&str> = t.lines().skip(3).collect();
        assert_eq!(rows.len(), 3, "{t}");
        let cells: Vec<&str> = rows[1].split_whitespace().collect();
        assert_eq!(
            cells,
            ["0", "7", "64", "64", "2", "2", "1", "0", "0", "0", "6", "0.25"]
        );
        assert!(rows[2].trim_start().starts_with("total"));
    }
}
