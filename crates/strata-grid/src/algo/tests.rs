//! Every algorithm against a plain in-memory reference, on small random multigraphs, with the
//! edge blocks resident, streamed from disk, and in both block orders.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use crate::algo::{
    Bfs, Configured, HyperAnf, Iteration, KCore, Mis, PageRank, PersonalizedPageRank, Radii, Scc,
    Spmv, Sssp, Wcc,
};
use crate::block_codec::Compression;
use crate::build::{build, BuildJob};
use crate::config::RunJob;
use crate::fixtures::grid_weighted;
use crate::layout::{Order, WeightRequest, WeightSource, WeightSpec};
use crate::place::VertexPlacement;
use crate::run::run;
use strata_store::config::{AutoSize, Size};
use strata_store::convert::{convert_binary, convert_text, BinaryJob, TextJob};
use strata_store::rng::Rng;
use strata_store::NoProgress;

/// A store of `m` random edges over `n` vertices (hubs included: a tenth of the endpoints
/// come from the first 8 vertices), with some self-loops and parallel edges.
fn store(dir: &Path, n: u64, m: u64, seed: u64) -> (PathBuf, Vec<(u64, u64)>) {
    let mut rng = Rng::new(seed);
    let pick = |rng: &mut Rng| {
        if rng.below(10) == 0 {
            rng.below(8)
        } else {
            rng.below(n)
        }
    };
    let edges: Vec<(u64, u64)> = (0..m).map(|_| (pick(&mut rng), pick(&mut rng))).collect();
    let bin = dir.join("edges.bin");
    let bytes: Vec<u8> = edges
        .iter()
        .flat_map(|&(u, v)| [(u as i32).to_le_bytes(), (v as i32).to_le_bytes()])
        .flatten()
        .collect();
    std::fs::write(&bin, bytes).unwrap();
    let out = dir.join("g.strata");
    let job: BinaryJob = serde_json::from_value(serde_json::json!({
        "graph": {"out": out, "memory": 256u64 << 20, "num_nodes": n},
        "inputs": [{"path": bin}],
    }))
    .unwrap();
    convert_binary(&job, &NoProgress).unwrap();
    (out, edges)
}

fn job(store: &Path, algorithm: Configured, memory: u64, grid: &str) -> RunJob {
    RunJob {
        keep_resident: memory == MEMORIES[0],
        vertex: match memory == MEMORIES[2] {
            true => VertexPlacement::Windows,
            false => VertexPlacement::Auto,
        },
        store: store.to_path_buf(),
        algorithm,
        grid: Some(grid.to_string()),
        memory: Size(memory),
        threads: 2,
        segment: AutoSize::Bytes(4096),
        // The windowed runs also take the no-prefetch path with more fetchers than credits.
        prefetch: if memory == MEMORIES[2] { 1 } else { 2 },
        disk_fetchers: if memory == MEMORIES[2] { 4 } else { 2 },
        far: None,
        out: None,
        weights: None,
        checkpoint_seconds: None,
    }
}

/// The grids the tests run every algorithm on: both block orders, plain and compressed
/// (each code in one order), so that every algorithm is checked against its reference on
/// compressed blocks resident, streamed from disk and with windowed vertex data.
const GRIDS: [(&str, Order, Compression); 4] = [
    ("c", Order::Column, Compression::None),
    ("r", Order::Row, Compression::None),
    ("cp", Order::Column, Compression::Packed),
    ("rb", Order::Row, Compression::Byte),
];

/// The column-order grids of [`GRIDS`].
const COLUMN_GRIDS: [(&str, Order, Compression); 2] = [
    ("c", Order::Column, Compression::None),
    ("cp", Order::Column, Compression::Packed),
];

fn grid(
    store: &Path,
    (name, order, compression): (&str, Order, Compression),
    partitions: u32,
    symmetrize: bool,
    weights: Option<WeightRequest>,
) {
    grid_weighted(
        store,
        name,
        partitions,
        (order, compression),
        symmetrize,
        weights,
    );
}

fn load_i64(path: &str) -> Vec<i64> {
    let (_, b) = strata_store::array::read_all_bytes(Path::new(path)).unwrap();
    bytemuck::pod_collect_to_vec(&b)
}

fn load_f64(path: &str) -> Vec<f64> {
    let (_, b) = strata_store::array::read_all_bytes(Path::new(path)).unwrap();
    bytemuck::pod_collect_to_vec(&b)
}

/// Budgets: everything resident; or (as marked in `job`) all edges streamed from disk; or
/// that and vertex data in windows too.
const MEMORIES: [u64; 3] = [1 << 30, 80 << 20, 81 << 20];

fn run_all(j: &RunJob) -> crate::run::RunSummary {
    let mut iters = Vec::new();
    let s = run(j, &NoProgress, &mut |it: &Iteration| {
        iters.push(it.clone());
        Ok(())
    })
    .unwrap();
    assert_eq!(s.placement.vertex_windowed, j.memory.0 == MEMORIES[2]);
    if j.memory.0 != MEMORIES[0] {
        assert!(
            s.bytes_disk > 0 && s.bytes_local == 0,
            "streamed from disk: {s:?}"
        );
    } else {
        assert!(s.bytes_disk == 0 && s.bytes_local > 0, "resident: {s:?}");
    }
    assert_eq!(iters.len(), s.iterations.max(iters.len()));
    s
}

/// The drawn weights the weighted tests build with.
const DRAWN: WeightSpec = WeightSpec::Random {
    seed: 5,
    low: 0.5,
    high: 2.0,
};

#[test]
fn pagerank_matches_power_iteration() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 3000;
    let (st, edges) = store(tmp.path(), n, 20_000, 1);
    for g @ (name, _, _) in GRIDS {
        grid(&st, g, 7, false, None);
        for memory in MEMORIES {
            let algo = Configured::new(PageRank {
                iterations: 15,
                tolerance: 0.0,
                damping: 0.85,
            });
            let s = run_all(&job(&st, algo, memory, name));
            let (_, b) = strata_store::array::read_all_bytes(Path::new(&s.arrays[0])).unwrap();
            let got: Vec<f32> = bytemuck::pod_collect_to_vec(&b);
            let r = power_iteration(n as usize, &edges, 15, &vec![1.0 / n as f64; n as usize]);
            assert_ranks(&got, &r, &format!("{name} {memory}"));
        }
    }
}

/// 15 PageRank iterations (damping 0.85) from the uniform vector, jumping by `p` (networkx's
/// personalization, dangling mass included).
fn power_iteration(n: usize, edges: &[(u64, u64)], iterations: usize, p: &[f64]) -> Vec<f64> {
    let mut deg = vec![0f64; n];
    for &(u, _) in edges {
        deg[u as usize] += 1.0;
    }
    let mut r = vec![1.0 / n as f64; n];
    for _ in 0..iterations {
        let dangling: f64 = (0..n).filter(|&v| deg[v] == 0.0).map(|v| r[v]).sum();
        let mut next: Vec<f64> = p.iter().map(|p| (0.15 + 0.85 * dangling) * p).collect();
        for &(u, v) in edges {
            next[v as usize] += 0.85 * r[u as usize] / deg[u as usize];
        }
        r = next;
    }
    r
}

fn assert_ranks(got: &[f32], want: &[f64], what: &str) {
    for (v, (&g, &r)) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        assert!((g - r).abs() <= 1e-5 * r + 1e-9, "{what} v{v}: {g} vs {r}");
    }
}

#[test]
fn personalized_pagerank_jumps_to_the_seeds() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 2000usize;
    let (st, edges) = store(tmp.path(), n as u64, 9000, 6);
    let mut p = vec![0.0; n];
    for v in [5, 17, 1999] {
        p[v] = 1.0 / 3.0;
    }
    let want = power_iteration(n, &edges, 15, &p);
    for g @ (name, _, _) in COLUMN_GRIDS {
        grid(&st, g, 5, false, None);
        for memory in MEMORIES {
            let algo = Configured::new(PersonalizedPageRank {
                iterations: 15,
                tolerance: 0.0,
                damping: 0.85,
                // A seed given twice counts once.
                seeds: ["5", "17", "1999", "5"].map(String::from).to_vec(),
            });
            let s = run_all(&job(&st, algo, memory, name));
            let (_, b) = strata_store::array::read_all_bytes(Path::new(&s.arrays[0])).unwrap();
            assert_ranks(
                &bytemuck::pod_collect_to_vec(&b),
                &want,
                &format!("{name} {memory}"),
            );
        }
    }
    let err = |seeds: &[&str]| {
        let algo = Configured::new(PersonalizedPageRank {
            seeds: seeds.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        });
        run(
            &job(&st, algo, MEMORIES[0], "c"),
            &NoProgress,
            &mut |_: &Iteration| Ok(()),
        )
        .unwrap_err()
        .to_string()
    };
    assert!(err(&["2000"]).contains("option seeds: vertex 2000 is not in the graph"));
    assert!(err(&["alice"]).contains("\"alice\" is not a vertex id"));
    assert!(err(&[]).contains("option seeds: need at least one seed"));
}

/// Each vertex's strongly connected component, labelled by its smallest vertex: u and v share
/// one when each reaches the other (searches from every vertex; small graphs).
fn brute_scc(n: usize, edges: &[(u64, u64)]) -> Vec<i64> {
    let mut adj = vec![Vec::new(); n];
    for &(u, v) in edges {
        adj[u as usize].push(v as usize);
    }
    let reach: Vec<Vec<bool>> = (0..n)
        .map(|s| {
            let mut seen = vec![false; n];
            seen[s] = true;
            let mut stack = vec![s];
            while let Some(u) = stack.pop() {
                for &v in &adj[u] {
                    if !seen[v] {
                        seen[v] = true;
                        stack.push(v);
                    }
                }
            }
            seen
        })
        .collect();
    (0..n)
        .map(|v| (0..n).find(|&u| reach[u][v] && reach[v][u]).unwrap() as i64)
        .collect()
}

#[test]
fn scc_matches_mutual_reachability() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 600usize;
    // Sparse enough for many components, some long paths and cycles among them.
    let (st, edges) = store(tmp.path(), n as u64, 700, 7);
    let want = brute_scc(n, &edges);
    let mut sizes = std::collections::HashMap::new();
    want.iter().for_each(|&c| *sizes.entry(c).or_insert(0) += 1);
    assert!(
        sizes.values().any(|&k| k > 10) && sizes.len() > 100,
        "{}",
        sizes.len()
    );
    for g @ (name, _, _) in GRIDS {
        grid(&st, g, 6, false, None);
        for memory in MEMORIES {
            let s = run_all(&job(&st, Configured::new(Scc {}), memory, name));
            assert_eq!(load_i64(&s.arrays[0]), want, "{name} {memory}");
            assert_eq!(s.result["components"], sizes.len());
        }
    }
}

#[test]
fn mis_is_the_greedy_set_by_priority_independent_and_maximal() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 1500usize;
    let (st, edges) = store(tmp.path(), n as u64, 5000, 9);
    let mut adj = vec![Vec::new(); n];
    for &(u, v) in &edges {
        if u != v {
            adj[u as usize].push(v as usize);
            adj[v as usize].push(u as usize);
        }
    }
    let greedy = |seed: u64| {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&v| Mis::priority(seed, v as u64));
        let mut set = vec![0i64; n];
        for v in order {
            if adj[v].iter().all(|&u| set[u] == 0) {
                set[v] = 1;
            }
        }
        set
    };
    for g @ (name, _, _) in GRIDS {
        grid(&st, g, 6, true, None);
        for memory in MEMORIES {
            for seed in [1, 2] {
                let s = run_all(&job(&st, Configured::new(Mis { seed }), memory, name));
                let got = load_i64(&s.arrays[0]);
                for v in 0..n {
                    let inside = adj[v].iter().filter(|&&u| got[u] == 1).count();
                    match got[v] {
                        1 => assert_eq!(inside, 0, "{v} and a neighbour are both in"),
                        _ => assert!(inside > 0, "{v} could join: not maximal"),
                    }
                }
                assert_eq!(got, greedy(seed), "{name} {memory} seed {seed}");
            }
        }
    }
    assert_ne!(greedy(1), greedy(2));
}

#[test]
fn hyperanf_is_within_the_hyperloglog_error_of_the_exact_neighbourhood_function() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 600usize;
    let (st, edges) = store(tmp.path(), n as u64, 900, 12);
    let mut adj = vec![Vec::new(); n];
    for &(u, v) in &edges {
        adj[u as usize].push(v as usize);
    }
    // Exact: ball[v] = vertices reaching v in at most t edges, by BFS from every vertex.
    let mut function = vec![0f64; n];
    let mut reach = vec![0f64; n];
    for x in 0..n {
        let mut dist = vec![usize::MAX; n];
        dist[x] = 0;
        let mut q = VecDeque::from([x]);
        while let Some(u) = q.pop_front() {
            for &v in &adj[u] {
                if dist[v] == usize::MAX {
                    dist[v] = dist[u] + 1;
                    q.push_back(v);
                }
            }
        }
        for (v, &d) in dist.iter().enumerate() {
            if d != usize::MAX {
                function[d..].iter_mut().for_each(|f| *f += 1.0);
                reach[v] += 1.0;
            }
        }
    }
    let depth = function.windows(2).take_while(|w| w[1] > w[0]).count();
    assert!(depth > 5, "a graph with depth");
    let algo = HyperAnf {
        log2_registers: 10,
        seed: 1,
    };
    let sigma = 1.04 / 32.0;
    for g @ (name, _, _) in COLUMN_GRIDS {
        grid(&st, g, 4, false, None);
        for memory in MEMORIES {
            let s = run_all(&job(&st, Configured::new(algo.clone()), memory, name));
            let got: Vec<f64> =
                serde_json::from_value(s.result["neighbourhood_function"].clone()).unwrap();
            for (t, want) in function.iter().enumerate().take(depth + 3) {
                let g = got[t.min(got.len() - 1)];
                assert!(
                    (g - want).abs() <= 3.0 * sigma * want,
                    "N({t}): {g} vs {want}"
                );
            }
            let est = load_f64(&s.arrays[0]);
            let mean: f64 = (0..n)
                .map(|v| (est[v] - reach[v]).abs() / reach[v])
                .sum::<f64>()
                / n as f64;
            assert!(mean <= 1.5 * sigma, "mean relative error {mean}");
        }
    }
}

#[test]
fn radii_are_the_farthest_sampled_sources() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 2000usize;
    let (st, edges) = store(tmp.path(), n as u64, 2600, 10);
    let mut adj = vec![Vec::new(); n];
    for &(u, v) in &edges {
        adj[u as usize].push(v as usize);
    }
    let radii = Radii {
        samples: 40,
        seed: 3,
    };
    let sources = radii.sources(n as u64);
    assert_eq!(sources.len(), 40);
    let mut want = vec![-1i64; n];
    for &s in &sources {
        let mut dist = vec![-1i64; n];
        dist[s as usize] = 0;
        let mut q = VecDeque::from([s as usize]);
        while let Some(u) = q.pop_front() {
            for &v in &adj[u] {
                if dist[v] < 0 {
                    dist[v] = dist[u] + 1;
                    q.push_back(v);
                }
            }
        }
        for v in 0..n {
            want[v] = want[v].max(dist[v]);
        }
    }
    assert!(want.iter().any(|&r| r > 5), "a graph with depth");
    for g @ (name, _, _) in GRIDS {
        grid(&st, g, 5, false, None);
        for memory in MEMORIES {
            let s = run_all(&job(&st, Configured::new(radii.clone()), memory, name));
            assert_eq!(load_i64(&s.arrays[0]), want, "{name} {memory}");
            let listed: Vec<u64> = serde_json::from_value(s.result["sources"].clone()).unwrap();
            assert_eq!(listed, sources);
        }
    }
}

#[test]
fn bfs_levels_match_and_parents_are_valid() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 2000u64;
    let (st, edges) = store(tmp.path(), n, 6000, 2);
    let mut adj = vec![Vec::new(); n as usize];
    for &(u, v) in &edges {
        adj[u as usize].push(v as usize);
    }
    let mut want = vec![-1i64; n as usize];
    want[3] = 0;
    let mut q = VecDeque::from([3usize]);
    while let Some(u) = q.pop_front() {
        for &v in &adj[u] {
            if want[v] < 0 {
                want[v] = want[u] + 1;
                q.push_back(v);
            }
        }
    }
    for g @ (name, _, _) in GRIDS {
        grid(&st, g, 5, false, None);
        for memory in MEMORIES {
            let s = run_all(&job(&st, Configured::new(Bfs { root: 3 }), memory, name));
            let (level, parent) = (load_i64(&s.arrays[0]), load_i64(&s.arrays[1]));
            assert_eq!(level, want);
            for v in 0..n as usize {
                if level[v] > 0 {
                    let p = parent[v] as usize;
                    assert_eq!(level[p], level[v] - 1);
                    assert!(adj[p].contains(&v));
                }
            }
        }
        // A vertex is claimed once, however many frontier edges reach it: pass k has level k
        // active and activates exactly level k + 1.
        let size = |l: i64| want.iter().filter(|&&x| x == l).count() as u64;
        let levels: Vec<(u64, f64)> = (0..)
            .take_while(|&l| size(l) > 0)
            .map(|l| (size(l), size(l + 1) as f64))
            .collect();
        let mut passes = Vec::new();
        let j = job(&st, Configured::new(Bfs { root: 3 }), MEMORIES[1], name);
        run(&j, &NoProgress, &mut |it: &Iteration| {
            passes.push((it.active, it.value));
            Ok(())
        })
        .unwrap();
        assert_eq!(passes, levels, "{name}");
    }
}

#[test]
fn wcc_and_kcore_match_references() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 1500usize;
    let (st, edges) = store(tmp.path(), n as u64, 1400, 3);
    // Components by union-find; label = smallest member.
    let mut up: Vec<usize> = (0..n).collect();
    fn root(up: &mut [usize], mut x: usize) -> usize {
        while up[x] != x {
            up[x] = up[up[x]];
            x = up[x];
        }
        x
    }
    for &(u, v) in &edges {
        let (a, b) = (root(&mut up, u as usize), root(&mut up, v as usize));
        up[a.max(b)] = a.min(b);
    }
    let want_cc: Vec<i64> = (0..n).map(|v| root(&mut up, v) as i64).collect();
    // Core numbers of the simple graph by repeated minimum-degree removal: the hubs' repeated
    // and reciprocal edges count once, self-loops not at all.
    let simple: std::collections::BTreeSet<(usize, usize)> = edges
        .iter()
        .filter(|(u, v)| u != v)
        .map(|&(u, v)| (u.min(v) as usize, u.max(v) as usize))
        .collect();
    assert!(simple.len() < edges.len(), "the store repeats edges");
    let mut deg = vec![0i64; n];
    let mut adj = vec![Vec::new(); n];
    for &(u, v) in &simple {
        deg[u] += 1;
        deg[v] += 1;
        adj[u].push(v);
        adj[v].push(u);
    }
    let mut core = vec![-1i64; n];
    let mut k = 0;
    for _ in 0..n {
        let v = (0..n)
            .filter(|&v| core[v] < 0)
            .min_by_key(|&v| deg[v])
            .unwrap();
        k = k.max(deg[v]);
        core[v] = k;
        for &w in &adj[v] {
            if core[w] < 0 {
                deg[w] -= 1;
            }
        }
    }
    for g @ (name, order, compression) in GRIDS {
        grid(&st, g, 6, true, None);
        let simple_name = format!("{name}-simple");
        build(
            &BuildJob {
                store: st.clone(),
                name: simple_name.clone(),
                partitions: 6,
                order,
                symmetrize: Some(true),
                simple: true,
                memory: Size(256 << 20),
                compression,
                ..Default::default()
            },
            &NoProgress,
        )
        .unwrap();
        for memory in MEMORIES {
            let s = run_all(&job(&st, Configured::new(Wcc {}), memory, name));
            assert_eq!(load_i64(&s.arrays[0]), want_cc);
            let s = run_all(&job(&st, Configured::new(KCore {}), memory, &simple_name));
            assert_eq!(load_i64(&s.arrays[0]), core);
        }
        // On the grid that keeps every edge, the hubs' repeats would inflate their cores.
        let err = run(
            &job(&st, Configured::new(KCore {}), MEMORIES[0], name),
            &NoProgress,
            &mut |_| Ok(()),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("is not simple and kcore needs it"), "{err}");
    }
}

/// Shortest distances from vertex 0, by repeated scans (small n); `w(k)` weighs edge k.
fn dijkstra(n: usize, edges: &[(u64, u64)], w: impl Fn(usize) -> f64) -> Vec<f64> {
    let mut dist = vec![f64::INFINITY; n];
    let mut done = vec![false; n];
    dist[0] = 0.0;
    while let Some(u) = (0..n)
        .filter(|&v| !done[v] && dist[v].is_finite())
        .min_by(|&a, &b| dist[a].total_cmp(&dist[b]))
    {
        done[u] = true;
        for (k, &(a, b)) in edges.iter().enumerate() {
            if a as usize == u {
                dist[b as usize] = dist[b as usize].min(dist[u] + w(k));
            }
        }
    }
    dist
}

fn assert_distances(got: &[f64], want: &[f64]) {
    for (v, (g, d)) in got.iter().zip(want).enumerate() {
        assert!(
            g == d || (g - d).abs() < 1e-9 * d.max(1.0),
            "v{v}: {g} vs {d}"
        );
    }
}

#[test]
fn sssp_and_spmv_match_references() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 1000usize;
    let (st, edges) = store(tmp.path(), n as u64, 5000, 4);
    let w = |a, b| DRAWN.drawn(a, b).unwrap();
    let dist = dijkstra(n, &edges, |k| w(edges[k].0, edges[k].1) as f64);
    let x: Vec<f64> = (0..n).map(|v| (v % 7) as f64 - 2.5).collect();
    let vec_path = tmp.path().join("x.npy");
    let mut wr =
        strata_store::array::NpyWriter::create(&vec_path, strata_store::DType::F64, &[], 1 << 16)
            .unwrap();
    wr.write(&x).unwrap();
    wr.finish().unwrap();
    let mut y = vec![0f64; n];
    for &(a, b) in &edges {
        y[b as usize] += w(a, b) as f64 * x[a as usize];
    }
    for g @ (name, _, _) in GRIDS {
        grid(&st, g, 4, false, Some(WeightRequest::random(5, 0.5, 2.0)));
        for memory in MEMORIES {
            let s = run_all(&job(&st, Configured::new(Sssp { root: 0 }), memory, name));
            assert_distances(&load_f64(&s.arrays[0]), &dist);
            let algo = Configured::new(Spmv {
                vector: Some(vec_path.clone()),
                weighted: true,
            });
            let s = run_all(&job(&st, algo, memory, name));
            let got = load_f64(&s.arrays[0]);
            for v in 0..n {
                assert!((got[v] - y[v]).abs() < 1e-9 * y[v].abs().max(1.0), "v{v}");
            }
        }
    }
}

/// A store converted from `src dst weight` lines whose weights are float32 values in [0.1, 3).
fn weighted_store(dir: &Path, n: u64, m: usize) -> (PathBuf, Vec<(u64, u64)>, Vec<f32>) {
    let mut rng = Rng::new(11);
    let edges: Vec<(u64, u64)> = (0..m).map(|_| (rng.below(n), rng.below(n))).collect();
    let weights: Vec<f32> = (0..m)
        .map(|_| 0.1 + rng.below(2900) as f32 / 1000.0)
        .collect();
    let text: String = edges
        .iter()
        .zip(&weights)
        .map(|(&(u, v), w)| format!("{u}\t{v}\t{w}\n"))
        .collect();
    let tsv = dir.join("edges.tsv");
    std::fs::write(&tsv, text).unwrap();
    let out = dir.join("w.strata");
    convert_weighted(&tsv, &out, n);
    (out, edges, weights)
}

/// Converts `src dst weight` lines of `tsv` among `n` nodes into store `out`.
fn convert_weighted(tsv: &Path, out: &Path, n: u64) {
    let job: TextJob = serde_json::from_value(serde_json::json!({
        "graph": {"out": out, "memory": 256u64 << 20, "num_nodes": n},
        "text": {"inputs": [{"path": tsv, "split": "train"}], "columns": ["src", "dst", "weight"],
                 "delimiter": "auto", "comment": "#", "header": false, "ids": "int", "relation_ids": "int"},
    }))
    .unwrap();
    convert_text(&job, &NoProgress).unwrap();
}

#[test]
fn sssp_follows_the_stores_own_weights() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 400usize;
    let (st, edges, weights) = weighted_store(tmp.path(), n as u64, 3000);
    let want = dijkstra(n, &edges, |k| weights[k] as f64);
    // No grid named: the run builds one from the store's weights (auto), then finds it again.
    for source in [WeightSource::Auto, WeightSource::Store] {
        let mut j = job(&st, Configured::new(Sssp { root: 0 }), MEMORIES[1], "");
        j.grid = None;
        j.weights = Some(WeightRequest {
            source,
            ..WeightRequest::default()
        });
        assert_distances(&load_f64(&run_all(&j).arrays[0]), &want);
    }
    let grids: Vec<String> = std::fs::read_dir(st.join("grids"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(grids.len(), 1, "{grids:?}");
    assert!(grids[0].ends_with("-ws"), "{grids:?}");
    let manifest = crate::grid::Grid::open(&st.join("grids").join(&grids[0])).unwrap();
    let (lo, hi) = manifest.manifest().weight_range.unwrap();
    let min = weights.iter().copied().fold(f32::INFINITY, f32::min);
    assert!(lo == min && hi <= 3.0, "{lo} {hi}");
    // Drawn weights on the same store: another grid, other distances.
    let mut j = job(&st, Configured::new(Sssp { root: 0 }), MEMORIES[1], "");
    j.grid = None;
    j.weights = Some(WeightRequest::random(5, 0.5, 2.0));
    let drawn = load_f64(&run_all(&j).arrays[0]);
    assert_distances(
        &drawn,
        &dijkstra(n, &edges, |k| {
            DRAWN.drawn(edges[k].0, edges[k].1).unwrap() as f64
        }),
    );
    assert_eq!(std::fs::read_dir(st.join("grids")).unwrap().count(), 2);
}

#[test]
fn negative_store_weights_are_refused_by_sssp_and_kept_by_spmv() {
    let tmp = tempfile::tempdir().unwrap();
    let tsv = tmp.path().join("e.tsv");
    std::fs::write(&tsv, "0\t1\t2.5\n1\t2\t-1.5\n2\t0\t1\n").unwrap();
    let out = tmp.path().join("neg.strata");
    convert_weighted(&tsv, &out, 3);
    let weighted = Some(WeightRequest::default());
    grid(
        &out,
        ("g", Order::Column, Compression::None),
        1,
        false,
        weighted,
    );
    let mut j = job(&out, Configured::new(Sssp { root: 0 }), MEMORIES[0], "g");
    j.weights = weighted;
    let err = run(&j, &NoProgress, &mut |_: &Iteration| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("non-negative") && err.contains("-1.5"),
        "{err}"
    );
    let spmv = Configured::new(Spmv {
        vector: None,
        weighted: true,
    });
    let y = load_f64(&run_all(&job(&out, spmv, MEMORIES[0], "g")).arrays[0]);
    assert_eq!(y, vec![1.0, 2.5, -1.5]);
}

#[test]
fn bad_inputs_fail_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let (st, _) = store(tmp.path(), 100, 300, 5);
    grid(&st, ("g", Order::Column, Compression::None), 2, false, None);
    let err = |j: RunJob| {
        run(&j, &NoProgress, &mut |_: &Iteration| Ok(()))
            .unwrap_err()
            .to_string()
    };
    assert!(err(job(&st, Configured::new(Bfs { root: 100 }), 1 << 30, "g")).contains("root"));
    assert!(err(job(&st, Configured::new(Wcc {}), 1 << 30, "g")).contains("symmetric"));
    assert!(err(job(&st, Configured::new(Sssp { root: 0 }), 1 << 30, "g")).contains("weights"));
    assert!(err(job(
        &st,
        Configured::new(PageRank {
            iterations: 1,
            tolerance: 0.0,
            damping: 0.85
        }),
        1 << 20,
        "g"
    ))
    .contains("memory budget"));
    assert!(
        err(job(&st, Configured::new(Bfs { root: 0 }), 1 << 30, "nope")).contains("not a grid")
    );
    // A grid whose edge file was cut short is refused, not read.
    let edges = st.join("grids/g/edges.npy");
    let len = std::fs::metadata(&edges).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&edges)
        .unwrap()
        .set_len(len - 8)
        .unwrap();
    assert!(err(job(&st, Configured::new(Bfs { root: 0 }), 1 << 30, "g")).contains("edges.npy"));
}
