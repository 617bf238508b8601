//! Programs against the native algorithms they restate (PageRank, BFS, WCC, SSSP), in memory,
//! from disk, with windowed vertex data, in row order and on compressed grids; and the errors
//! of programs that cannot run.

use std::path::Path;

use serde_json::{json, Value};
use strata_io::progress::NoProgress;
use strata_store::config::check;

use super::spec::tests::pagerank;
use crate::algo::Iteration;
use crate::block_codec::Compression;
use crate::config::RunOptions;
use crate::fixtures::{coded_name, grids, store, store_of};
use crate::run::{run, RunSummary};
use crate::GridError;

/// Runs the `[run]` options `given` (plus `store`, 2 threads and an `out` named `name`) with
/// its iterations collected.
fn run_with(
    st: &Path,
    name: &str,
    given: Value,
) -> Result<(RunSummary, Vec<Iteration>), GridError> {
    let mut options = json!({
        "store": st,
        "out": st.parent().unwrap().join(name),
        "threads": 2,
        "memory": "256M",
    });
    options
        .as_object_mut()
        .unwrap()
        .extend(given.as_object().unwrap().clone());
    let job = check::<RunOptions>(&options).unwrap().job().unwrap();
    let mut iterations = Vec::new();
    let s = run(&job, &NoProgress, &mut |it| {
        iterations.push(it.clone());
        Ok(())
    })?;
    Ok((s, iterations))
}

fn program(spec: Value) -> Value {
    json!({"algorithm": "program", "program": spec.to_string()})
}

fn array<T: bytemuck::Pod>(s: &RunSummary, name: &str) -> Vec<T> {
    let path = s
        .arrays
        .iter()
        .find(|p| p.ends_with(&format!("/{name}.npy")))
        .unwrap_or_else(|| panic!("no {name} in {:?}", s.arrays));
    let (_, b) = strata_store::array::read_all_bytes(Path::new(path)).unwrap();
    bytemuck::pod_collect_to_vec(&b)
}

/// The placements a program must give the same results in: resident, streamed from disk,
/// streamed with windowed vertex data; each with the grid named.
fn placements(grid: &str) -> Vec<Value> {
    vec![
        json!({"grid": grid}),
        json!({"grid": grid, "keep_resident": false, "segment": "4K", "prefetch": 2}),
        json!({"grid": grid, "keep_resident": false, "segment": "4K", "vertex": "windows"}),
    ]
}

fn merged(a: &Value, b: &Value) -> Value {
    let mut m = a.clone();
    m.as_object_mut()
        .unwrap()
        .extend(b.as_object().unwrap().clone());
    m
}

#[test]
fn pagerank_as_a_program_gives_the_native_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let st = store(tmp.path(), 3000, 20_000);
    grids(&st, 5, Compression::None);
    crate::build::build(
        &crate::build::BuildJob {
            store: st.clone(),
            name: "row".into(),
            partitions: 4,
            order: crate::layout::Order::Row,
            ..Default::default()
        },
        &NoProgress,
    )
    .unwrap();
    let spec = serde_json::to_value(pagerank()).unwrap();
    for grid in ["s0-w0", "row"] {
        let (native, _) = run_with(
            &st,
            "native",
            json!({"algorithm": "pagerank", "iterations": 20, "grid": grid}),
        )
        .unwrap();
        let want: Vec<f32> = array(&native, "rank");
        for (k, place) in placements(grid).iter().enumerate() {
            let (s, its) =
                run_with(&st, &format!("p{k}"), merged(&program(spec.clone()), place)).unwrap();
            assert_eq!(s.iterations, 20);
            assert_eq!(its.len(), 20);
            assert_eq!(s.result["stopped"], "iterations");
            let got: Vec<f32> = array(&s, "rank");
            assert_eq!(s.arrays.len(), 1, "outputs: rank only");
            for (v, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs() + 1e-10,
                    "{grid} {place}: v{v} {g} vs {w}"
                );
            }
            assert!(s.result["aggregates"]["dangling"].as_f64().unwrap() >= 0.0);
        }
    }
}

#[test]
fn a_program_streams_from_far_memory_like_any_algorithm() {
    let tmp = tempfile::tempdir().unwrap();
    let st = store(tmp.path(), 3000, 20_000);
    grids(&st, 5, Compression::None);
    let spec = serde_json::to_value(pagerank()).unwrap();
    let local = json!({"grid": "s0-w0", "segment": "4K"});
    let (want, _) = run_with(&st, "local", merged(&program(spec.clone()), &local)).unwrap();
    let (addr, stop, serving) = crate::fixtures::far_server();
    let far = merged(
        &local,
        &json!({"far": addr, "far_ratio": 0.7, "far_connections": 1}),
    );
    let (got, _) = run_with(&st, "far", merged(&program(spec), &far)).unwrap();
    stop.stop();
    serving.join().unwrap();
    assert!(got.bytes_far > 0 && got.far_failure.is_none(), "{got:?}");
    assert_eq!(array::<f32>(&got, "rank"), array::<f32>(&want, "rank"));
}

#[test]
fn until_reads_the_aggregates_and_stops_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let st = store(tmp.path(), 2000, 10_000);
    grids(&st, 3, Compression::None);
    let mut spec = serde_json::to_value(pagerank()).unwrap();
    spec["iterations"] = json!(200);
    spec["aggregates"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "delta", "reduce": "sum", "expr": "abs(rank - old.rank)"}));
    spec["until"] = json!("delta < n * 1e-7");
    let (s, its) = run_with(&st, "until", program(spec)).unwrap();
    assert_eq!(s.result["stopped"], "until");
    assert!(s.iterations < 200 && s.iterations == its.len());
    assert!(s.result["aggregates"]["delta"].as_f64().unwrap() < 2000.0 * 1e-7);
}

/// BFS levels: min-combined `src.level + 1` along the edges of the vertices reached last.
fn bfs(root: u64) -> Value {
    json!({
        "name": "bfs",
        "params": {"root": root},
        "values": [{"name": "level", "dtype": "i64", "init": "0 if id == root else -1"}],
        "edge": "src.level + 1",
        "combine": "min",
        "apply": ["level = acc if level < 0 else level"],
        "active": "level != old.level",
        "start": "id == root",
        "aggregates": [{"name": "reached", "reduce": "sum", "expr": "level != old.level"}],
    })
}

#[test]
fn bfs_as_a_program_reads_only_the_frontier_and_gives_the_native_levels() {
    let tmp = tempfile::tempdir().unwrap();
    // A path 0 -> 1 -> ... -> 399 and a separate cycle on 400..500: many levels, some
    // vertices never reached, and chunks with nothing active.
    let edges = (0..399u64)
        .map(|v| (v, v + 1))
        .chain((400..500).map(|v| (v, if v == 499 { 400 } else { v + 1 })));
    let st = store_of(tmp.path(), 500, edges);
    grids(&st, 5, Compression::None);
    let (native, _) = run_with(
        &st,
        "native",
        json!({"algorithm": "bfs", "root": 3, "grid": "s0-w0"}),
    )
    .unwrap();
    let want: Vec<i64> = array(&native, "level");
    for (k, place) in placements("s0-w0").iter().enumerate() {
        let (s, its) = run_with(&st, &format!("b{k}"), merged(&program(bfs(3)), place)).unwrap();
        assert_eq!(array::<i64>(&s, "level"), want, "{place}");
        assert_eq!(s.result["stopped"], "no active vertex");
        // One iteration a level (the last finds nothing new), each with one vertex active.
        assert_eq!(its.len(), 397);
        assert!(its.iter().all(|it| it.active == 1));
        assert!(its.iter().all(|it| it.pass.blocks_skipped > 0));
        assert_eq!(its.last().unwrap().value, 0.0);
    }
}

#[test]
fn wcc_and_sssp_as_programs_give_the_native_results() {
    let tmp = tempfile::tempdir().unwrap();
    let st = store(tmp.path(), 1500, 2500);
    grids(&st, 4, Compression::None);
    // The programs also read packed grids, their blocks decoded as fetched.
    grids(&st, 4, Compression::Packed);
    let wcc = json!({
        "name": "wcc",
        "values": [{"name": "component", "dtype": "i64", "init": "id"}],
        "edge": "src.component",
        "combine": "min",
        "apply": ["component = min(component, acc)"],
        "active": "component < old.component",
        "symmetric": true,
    });
    let sssp = json!({
        "name": "sssp",
        "values": [{"name": "distance", "dtype": "f64", "init": "0 if id == 1 else inf"}],
        "edge": "src.distance + weight",
        "combine": "min",
        "apply": ["distance = min(distance, acc)"],
        "active": "distance < old.distance",
        "start": "id == 1",
    });
    let cases = [
        (
            "wcc",
            wcc,
            json!({"algorithm": "wcc"}),
            "component",
            "s1-w0",
        ),
        (
            "sssp",
            sssp,
            json!({"algorithm": "sssp", "root": 1}),
            "distance",
            "s0-w1",
        ),
    ];
    for (name, spec, native, array_name, grid) in cases {
        let (native, _) = run_with(&st, name, merged(&native, &json!({"grid": grid}))).unwrap();
        let packed = coded_name(grid, Compression::Packed);
        let places = [placements(grid), placements(&packed)].concat();
        for (k, place) in places.iter().enumerate() {
            let (s, _) = run_with(
                &st,
                &format!("{name}{k}"),
                merged(&program(spec.clone()), place),
            )
            .unwrap();
            if name == "wcc" {
                assert_eq!(
                    array::<i64>(&s, array_name),
                    array::<i64>(&native, array_name)
                );
            } else {
                let (got, want) = (
                    array::<f64>(&s, array_name),
                    array::<f64>(&native, array_name),
                );
                for (v, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        g == w || (g - w).abs() <= 1e-5 * w,
                        "{place} v{v}: {g} vs {w}"
                    );
                }
            }
        }
    }
    // Without a grid named, the program gets one built for what it reads: symmetric for wcc.
    let (s, _) = run_with(
        &st,
        "auto",
        program(json!({
            "name": "degree",
            "values": [{"name": "d", "dtype": "f64", "init": "0"}],
            "edge": "weight",
            "apply": ["d = acc"],
            "iterations": 1,
        })),
    )
    .unwrap();
    assert!(s.grid.to_string_lossy().contains("-w"), "{:?}", s.grid);
}

#[test]
fn programs_that_cannot_run_say_why() {
    let tmp = tempfile::tempdir().unwrap();
    let st = store(tmp.path(), 300, 1000);
    grids(&st, 2, Compression::None);
    let err = |given: Value| {
        run_with(&st, "bad", merged(&given, &json!({"grid": "s0-w0"})))
            .unwrap_err()
            .to_string()
    };
    // A value an int64 array cannot hold: the step, the vertex and the value.
    let mut spec = bfs(0);
    spec["apply"] = json!(["level = acc * inf"]);
    let e = err(program(spec));
    assert!(
        e.starts_with("program 'bfs': apply statement 1 (level): vertex ")
            && e.contains("got inf, which the int64 array 'level' cannot hold"),
        "{e}"
    );
    let mut spec = bfs(0);
    spec["values"][0]["init"] = json!("1 / 0");
    assert!(err(program(spec)).starts_with("program 'bfs': init of level: vertex 0 got inf"));
    assert_eq!(
        err(json!({"algorithm": "program"})),
        "option program: the program algorithm runs the vertex program --program names, and none is given"
    );
    let py = tmp.path().join("p.py");
    assert!(err(json!({"algorithm": "program", "program": py}))
        .ends_with("p.py: a .py or .toml program is read by Strata's Python front end (strata run, strata.grid.run_program), which hands the engine its JSON"));
}

#[test]
fn a_json_file_is_a_program_and_its_errors_are_config_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("pr.json");
    std::fs::write(&file, serde_json::to_string(&pagerank()).unwrap()).unwrap();
    let given = |p: &str| json!({"store": "g", "algorithm": "program", "program": p});
    check::<RunOptions>(&given(file.to_str().unwrap())).unwrap();
    let mut bad = pagerank();
    bad.edge = "src.rnk".into();
    std::fs::write(&file, serde_json::to_string(&bad).unwrap()).unwrap();
    let e = check::<RunOptions>(&given(file.to_str().unwrap()))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("run.program: program 'pagerank': edge: unknown vertex array 'rnk'"),
        "{e}"
    );
    let e = check::<RunOptions>(&given("{\"name\": \"x\"}"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("run.program: not a vertex program: missing field"),
        "{e}"
    );
    let e = check::<RunOptions>(&given("prog.txt"))
        .unwrap_err()
        .to_string();
    assert_eq!(e, "run.program: prog.txt: expected a .py, .toml or .json program file, or the program as JSON text");
    // Checked whichever algorithm runs, as every parameter is.
    let mut pr = given("{\"name\": 1}");
    pr["algorithm"] = json!("pagerank");
    assert!(check::<RunOptions>(&pr)
        .unwrap_err()
        .to_string()
        .starts_with("run.program: not a vertex program"));
}
