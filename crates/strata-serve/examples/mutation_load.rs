//! A native load generator for S3's mutation path: `CLIENTS` concurrent gRPC clients, each on
//! its own connection, send `AddEdge` (one edge per call, endpoints drawn uniformly from the
//! graph's vertices at the start) to a running `strata serve` for `SECONDS`, and one JSON line
//! reports calls, errors, acknowledged mutations/s and latency p50/p99 per call (ms). With
//! `--batch N` above 1, each call is a `Mutate` of N such `AddEdge`s (one log record); N = 1
//! keeps the unary `AddEdge`.
//!
//! ```text
//! cargo run --release -p strata-serve --example mutation_load -- --addr HOST:PORT
//!     [--clients 16] [--seconds 20] [--batch 1] [--graph g] [--token TOKEN] [--seed 0]
//! ```
//!
//! Python clients (`benches/bench_serve.py --only s3 --s3-mix mutations`) spend about 0.6 ms
//! of client CPU per call, so on a small machine they, not the server, set the pace and the
//! server seldom sees two mutations at once; this client costs a few microseconds per call,
//! so concurrent mutations reach the server together, as group commit needs.

use std::time::{Duration, Instant};

use strata_serve::proto::graph_learning_client::GraphLearningClient;
use strata_serve::proto::mutation::Kind;
use strata_serve::proto::{EdgeRequest, MutateRequest, Mutation, StatusRequest};
use strata_store::rng::splitmix as next;
use tonic::transport::Channel;

/// The command line, with its defaults.
struct Options {
    addr: String,
    clients: usize,
    seconds: f64,
    /// Mutations per call.
    batch: usize,
    graph: String,
    token: Option<String>,
    seed: u64,
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "mutation_load: {problem}\nusage: mutation_load --addr HOST:PORT [--clients N] \
         [--seconds S] [--batch N] [--graph NAME] [--token TOKEN] [--seed N]"
    );
    std::process::exit(2)
}

fn parse<T: std::str::FromStr>(flag: &str, value: &str) -> T {
    value
        .parse()
        .unwrap_or_else(|_| usage(&format!("{flag}: cannot read '{value}'")))
}

fn options() -> Options {
    let mut o = Options {
        addr: String::new(),
        clients: 16,
        seconds: 20.0,
        batch: 1,
        graph: "g".into(),
        token: None,
        seed: 0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| usage(&format!("{flag}: needs a value")));
        match flag.as_str() {
            "--addr" => o.addr = value,
            "--clients" => o.clients = parse(&flag, &value),
            "--seconds" => o.seconds = parse(&flag, &value),
            "--batch" => o.batch = parse(&flag, &value),
            "--graph" => o.graph = value,
            "--token" => o.token = Some(value),
            "--seed" => o.seed = parse(&flag, &value),
            _ => usage(&format!("unknown option '{flag}'")),
        }
    }
    if o.addr.is_empty() {
        usage("--addr is required");
    }
    if o.clients == 0 || o.seconds <= 0.0 || o.batch == 0 {
        usage("--clients, --seconds and --batch must be positive");
    }
    o
}

/// A request carrying the bearer token when the server needs one.
fn request<T>(message: T, token: &Option<String>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    if let Some(t) = token {
        let value = format!("Bearer {t}")
            .parse()
            .unwrap_or_else(|_| usage("--token: not a valid header value"));
        req.metadata_mut().insert("authorization", value);
    }
    req
}

/// What one client saw: the latency of each acknowledged call, and the failed calls.
struct Tally {
    latency: Vec<Duration>,
    errors: Vec<String>,
}

/// One client: calls of `o.batch` `AddEdge`s, each of one random edge between distinct
/// vertices below `nodes`, one call at a time, until `until`.
async fn client(
    mut c: GraphLearningClient<Channel>,
    o: &Options,
    nodes: u64,
    mut rng: u64,
    until: Instant,
) -> Tally {
    let mut tally = Tally {
        latency: Vec::new(),
        errors: Vec::new(),
    };
    let mut edge = |graph: String| {
        let src = next(&mut rng) % nodes;
        let dst = (src + 1 + next(&mut rng) % (nodes - 1)) % nodes;
        EdgeRequest {
            graph,
            src: vec![src],
            dst: vec![dst],
        }
    };
    while Instant::now() < until {
        let t0 = Instant::now();
        let sent = if o.batch == 1 {
            let one = edge(o.graph.clone());
            c.add_edge(request(one, &o.token)).await.map(drop)
        } else {
            // The batch names the graph once; its mutations leave theirs empty.
            let mutations = (0..o.batch)
                .map(|_| Mutation {
                    kind: Some(Kind::AddEdge(edge(String::new()))),
                })
                .collect();
            let batch = MutateRequest {
                graph: o.graph.clone(),
                mutations,
            };
            c.mutate(request(batch, &o.token)).await.map(drop)
        };
        match sent {
            Ok(()) => tally.latency.push(t0.elapsed()),
            Err(s) => tally
                .errors
                .push(format!("{:?}: {}", s.code(), s.message())),
        }
    }
    tally
}

/// The `q`-quantile (0 to 1) of sorted latencies, in ms.
fn quantile_ms(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o: &'static Options = Box::leak(Box::new(options()));
    let endpoint = format!("http://{}", o.addr);
    // One connection per client, as each Python client thread of S3 has its own.
    let mut conns = Vec::with_capacity(o.clients);
    for _ in 0..o.clients {
        conns.push(GraphLearningClient::connect(endpoint.clone()).await?);
    }
    let status = conns[0]
        .status(request(StatusRequest {}, &o.token))
        .await?
        .into_inner();
    let nodes = status
        .graphs
        .iter()
        .find(|g| g.name == o.graph)
        .ok_or_else(|| format!("the server has no graph '{}'", o.graph))?
        .num_nodes;
    if nodes < 2 {
        return Err(format!("graph '{}' has {nodes} vertices; need 2", o.graph).into());
    }
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(o.seconds);
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let rng = next(&mut (o.seed ^ (i as u64 + 1)));
            tokio::spawn(client(c, o, nodes, rng, until))
        })
        .collect();
    let mut latency = Vec::new();
    let mut errors = Vec::new();
    for t in tasks {
        let tally = t.await?;
        latency.extend(tally.latency);
        errors.extend(tally.errors);
    }
    let seconds = started.elapsed().as_secs_f64();
    latency.sort_unstable();
    let (p50, p99) = if latency.is_empty() {
        (f64::NAN, f64::NAN)
    } else {
        (quantile_ms(&latency, 0.5), quantile_ms(&latency, 0.99))
    };
    let failed = errors.len();
    errors.truncate(5);
    let mutations = latency.len() * o.batch;
    let report = serde_json::json!({
        "clients": o.clients,
        "batch": o.batch,
        "seconds": seconds,
        "calls": latency.len() + failed,
        "acknowledged_calls": latency.len(),
        "acknowledged": mutations,
        "errors": failed,
        "first_errors": errors,
        "mutations_per_s": mutations as f64 / seconds,
        "p50_ms": p50,
        "p99_ms": p99,
    });
    println!("{report}");
    Ok(())
}
