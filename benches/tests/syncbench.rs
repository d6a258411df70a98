//! The sync benchmark at a tiny size, so the harness cannot rot: every scenario runs over
//! the real transport and checks what arrived.

use computer_benches::syncbench::{self, Config};

#[test]
fn every_scenario_runs_at_a_tiny_size() {
    let config = Config {
        files: 150,
        big_bytes: 1 << 20,
        small_files: 10,
        reps: 1,
        progress: false,
        ..Config::quick()
    };
    let results = syncbench::run(&config).expect("the benchmark runs");
    let ids: Vec<&str> = results.rows.iter().map(|r| r.id).collect();
    assert_eq!(ids, ["a", "-", "+", "b", "b", "c", "c", "d", "d", "m", "-"]);
    for row in &results.rows {
        let sample = row.median();
        assert!(sample.up > 0 && sample.down > 0, "{}: {sample:?}", row.name);
        let (up, down) = sample.calls.bytes();
        assert!(up <= sample.up && down <= sample.down, "{}", row.name);
        if !["-", "m"].contains(&row.id) {
            let blocks = sample.report.blocks_in + sample.report.blocks_out;
            assert!(blocks > 0, "{}: no block travelled", row.name);
        }
    }
    // A head insertion re-sends a block or two, not the file.
    for row in results.rows.iter().filter(|r| r.id == "d") {
        let sample = row.median();
        assert!(
            sample.wire() < config.big_bytes as u64 / 4,
            "{}: {} bytes on the wire",
            row.name,
            sample.wire()
        );
    }
    let markdown = syncbench::report::markdown(&results);
    assert!(markdown.contains("| a |"), "{markdown}");
    assert_eq!(results.log_scans.len(), 2);
}
