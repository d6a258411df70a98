//! The markdown tables of a run.

use std::fmt::Write as _;
use std::time::Duration;

use super::meter::CallStat;
use super::{Results, Row, Sample};

/// `1,234 B`, `12.3 KiB`, `45.67 MiB`.
pub fn bytes(n: u64) -> String {
    const KIB: f64 = 1024.0;
    let x = n as f64;
    if n < 10_000 {
        format!("{} B", thousands(n))
    } else if x < KIB * KIB {
        format!("{:.1} KiB", x / KIB)
    } else if x < KIB * KIB * KIB {
        format!("{:.2} MiB", x / KIB / KIB)
    } else {
        format!("{:.2} GiB", x / KIB / KIB / KIB)
    }
}

pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `850 µs`, `12.3 ms`, `1.23 s`, `123 s`.
pub fn duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 0.001 {
        format!("{:.0} µs", s * 1e6)
    } else if s < 0.1 {
        format!("{:.1} ms", s * 1e3)
    } else if s < 1.0 {
        format!("{:.0} ms", s * 1e3)
    } else if s < 100.0 {
        format!("{s:.2} s")
    } else {
        format!("{s:.0} s")
    }
}

fn ratio(wire: u64, changed: u64) -> String {
    if changed == 0 {
        return "-".into();
    }
    let r = wire as f64 / changed as f64;
    if r >= 100.0 {
        format!("{}×", thousands(r.round() as u64))
    } else if r >= 10.0 {
        format!("{r:.0}×")
    } else {
        format!("{r:.2}×")
    }
}

fn up_down(stat: &CallStat) -> String {
    if stat.calls == 0 {
        return "-".into();
    }
    format!("{} / {}", bytes(stat.up), bytes(stat.down))
}

fn sent_blocks(s: &Sample) -> (usize, u64) {
    (
        s.report.blocks_in + s.report.blocks_out,
        s.report.bytes_in + s.report.bytes_out,
    )
}

fn time_cell(row: &Row) -> String {
    let median = row.median().time;
    if row.samples.len() < 3 {
        return duration(median);
    }
    let (min, max) = row.time_range();
    format!(
        "{} ({} – {})",
        duration(median),
        duration(min),
        duration(max)
    )
}

/// The tables, as markdown.
pub fn markdown(results: &Results) -> String {
    let mut out = String::new();
    if let Some(tree) = &results.tree {
        let _ = writeln!(
            out,
            "Tree: {}: {} files in {} directories, {} symlinks, {} ({} in distinct blocks, \
             {} stored after zstd, {} blocks{}); file sizes: median {}, 90th percentile {}, \
             99th {}, largest {}; written into the server in {:.1} s.\n",
            tree.source,
            thousands(tree.files),
            thousands(tree.dirs),
            thousands(tree.symlinks),
            bytes(tree.bytes),
            bytes(tree.unique_bytes),
            bytes(tree.stored_bytes),
            thousands(tree.blocks),
            if tree.duplicate_files > 0 {
                format!(
                    "; {} files are copies of others",
                    thousands(tree.duplicate_files)
                )
            } else {
                String::new()
            },
            bytes(tree.size_percentiles[0]),
            bytes(tree.size_percentiles[1]),
            bytes(tree.size_percentiles[2]),
            bytes(tree.size_percentiles[3]),
            tree.write_time.as_secs_f64()
        );
    }
    let _ = writeln!(
        out,
        "Transport: {}, through the counting proxy. Wire bytes are everything the proxy \
         forwarded during the sync (pull, then push), framing included, the hello apart. \
         Time: median of the runs (min – max).\n",
        results.transport
    );
    out.push_str(
        "| | scenario | data changed | in files of | wire ↑ replica→server | wire ↓ server→replica \
         | blocks sent | block data | wire ÷ changed | sync time | runs |\n",
    );
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n");
    for row in &results.rows {
        let s = row.median();
        let (blocks, block_bytes) = sent_blocks(s);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.id,
            row.name,
            bytes(row.changed),
            if row.files > 1 {
                format!("{} ({} files)", bytes(row.touched), thousands(row.files))
            } else {
                bytes(row.touched)
            },
            bytes(s.up),
            bytes(s.down),
            thousands(blocks as u64),
            bytes(block_bytes),
            ratio(s.wire(), row.changed),
            time_cell(row),
            row.samples.len()
        );
    }

    out.push_str(
        "\nWhere the bytes go (the run of median time; each cell is ↑ / ↓ bytes of those \
         calls; `other` is what no call accounts for: capnp-rpc's `Finish` messages after \
         the last call and the connection's end):\n\n",
    );
    out.push_str(
        "| | entries | `changes` (pages) | `have_blocks` (probes) | `get_blocks` | `put_blocks` + `push` \
         | `ack` | other | block data in it |\n",
    );
    out.push_str("|---|---:|---|---|---|---|---|---:|---:|\n");
    for row in &results.rows {
        let s = row.median();
        let c = &s.calls;
        let (changes, have, get, ack) = (
            c.get("changes"),
            c.get("have_blocks"),
            c.get("get_blocks"),
            c.get("ack"),
        );
        let (put, push) = (c.get("put_blocks"), c.get("push"));
        let sends = CallStat {
            calls: put.calls + push.calls,
            up: put.up + push.up,
            down: put.down + push.down,
            time: put.time + push.time,
            items: put.items + push.items,
        };
        let (call_up, call_down) = c.bytes();
        let other = (s.up + s.down).saturating_sub(call_up + call_down);
        let entries = s.report.pulled + s.report.pushed;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.id,
            thousands(entries as u64),
            with_calls(&changes),
            with_calls(&have),
            with_calls(&get),
            with_calls(&sends),
            with_calls(&ack),
            bytes(other),
            bytes(sent_blocks(s).1),
        );
    }
    out.push_str(
        "\nWhere the time goes (the run of median time). A wait is the replica's, for one \
         kind of call: the server's work and the transfer; `local` is the replica's own work \
         (probing its store, storing blocks, applying pages; reading its log to push):\n\n\
         | | sync | pull | `changes` | `get_blocks` | `ack` | pull, local | push \
         | `have_blocks` | `push` + `put_blocks` | push, local |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in &results.rows {
        let s = row.median();
        let c = &s.calls;
        let wait = |kinds: &[&str]| kinds.iter().map(|k| c.get(k).time).sum::<Duration>();
        let pull_waits = wait(&["changes", "get_blocks", "ack"]);
        let push_waits = wait(&["have_blocks", "push", "put_blocks"]);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.id,
            duration(s.time),
            duration(s.pull),
            duration(wait(&["changes"])),
            duration(wait(&["get_blocks"])),
            duration(wait(&["ack"])),
            duration(s.pull.saturating_sub(pull_waits)),
            duration(s.push()),
            duration(wait(&["have_blocks"])),
            duration(wait(&["push", "put_blocks"])),
            duration(s.push().saturating_sub(push_waits)),
        );
    }
    if let Some(hello) = results.rows.first().map(Row::median) {
        let _ = writeln!(
            out,
            "\nThe hello (connect, `Gate.hello`, not counted above): {} ↑ / {} ↓.",
            bytes(hello.hello_up),
            bytes(hello.hello_down)
        );
    }

    if let Some(row) = results.rows.iter().find(|r| r.id == "a") {
        out.push_str(&tree_times(row));
    }
    if !results.log_scans.is_empty() {
        out.push_str(&log_scans(&results.log_scans));
    }
    out
}

/// The in-process reads of each side's change log after (a).
fn log_scans(scans: &[super::LogScan]) -> String {
    let mut out = String::from(
        "\nReading the change log in-process after (a) (`Workspace::changes_after`, pages of \
         1024 entries from the start, as a sync asks for them; then one page of 1 entry and \
         one of 1024 at a few cursors):\n\n\
         | side | revisions | entries | pages | all pages | first page | last page \
         | cursor: entries after it → 1-entry page, 1024-entry page |\n\
         |---|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for scan in scans {
        let probes = scan
            .probes
            .iter()
            .map(|(after, one, full)| {
                format!(
                    "{} → {}, {}",
                    thousands(*after as u64),
                    duration(*one),
                    duration(*full)
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            scan.side,
            thousands(scan.revision),
            thousands(scan.entries as u64),
            scan.pages.len(),
            duration(scan.total()),
            duration(scan.pages.first().map_or(Duration::ZERO, |p| p.0)),
            duration(scan.pages.last().map_or(Duration::ZERO, |p| p.0)),
            probes
        );
    }
    out
}

fn with_calls(stat: &CallStat) -> String {
    if stat.calls == 0 {
        return "-".into();
    }
    format!("{}× {}", stat.calls, up_down(stat))
}

/// Where the time of the fresh replica's sync goes.
fn tree_times(row: &Row) -> String {
    let s = row.median();
    let mut out = String::new();
    let per_1000 = s.time.as_secs_f64() * 1000.0 / row.files.max(1) as f64;
    let c = &s.calls;
    let changes = c.get("changes");
    let get = c.get("get_blocks");
    let ack = c.get("ack");
    let pull_local = s
        .pull
        .saturating_sub(changes.time)
        .saturating_sub(get.time)
        .saturating_sub(ack.time);
    let pull_pages = s.calls.pages.len().min(changes.calls as usize);
    let _ = writeln!(
        out,
        "\nWhere the time of (a) goes (the run of median time): {} in all, {} per 1000 files, \
         {}/s of file data.\n",
        duration(s.time),
        duration(Duration::from_secs_f64(per_1000)),
        bytes((row.changed as f64 / s.time.as_secs_f64().max(1e-9)) as u64),
    );
    out.push_str("| part | time | share |\n|---|---:|---:|\n");
    let share = |d: Duration| format!("{:.0} %", 100.0 * d.as_secs_f64() / s.time.as_secs_f64());
    let mut line = |what: String, d: Duration| {
        let _ = writeln!(out, "| {what} | {} | {} |", duration(d), share(d));
    };
    line(
        format!(
            "pull: waiting for {} pages of entries (`changes`: the server reads the log)",
            changes.calls
        ),
        changes.time,
    );
    line(
        format!(
            "pull: waiting for blocks ({} `get_blocks` calls, {} blocks)",
            get.calls,
            thousands(get.items)
        ),
        get.time,
    );
    line(format!("pull: {} `ack` calls", ack.calls), ack.time);
    line(
        "pull: on the replica (probe its store, store the blocks, apply each page)".into(),
        pull_local,
    );
    line(
        "push: the replica reads its own log (all echoes) and sends nothing".into(),
        s.push(),
    );
    let pages = &s.calls.pages[..pull_pages];
    if pages.len() >= 2 {
        let show = |range: &[(Duration, usize, computer_vfs::Cursor)]| {
            range
                .iter()
                .map(|(d, n, _)| format!("{} ({n})", duration(*d)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let head = &pages[..pages.len().min(3)];
        let tail = &pages[pages.len().saturating_sub(3)..];
        let _ = writeln!(
            out,
            "\nEach `changes` call of the pull, time (entries): first {}; last {}.",
            show(head),
            show(tail)
        );
    }
    out
}
