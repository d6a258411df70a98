//! `stats`, `check` and `compact`: commands on the whole store, written once against
//! [`Files`] like the file operations (`fs_ops.rs`), so they print the same on a
//! database this process opened and through a server or an owner. Progress bars move
//! only where the work runs in this process; a server does it in one call.

use std::io::{BufWriter, Write};
use std::process::ExitCode;
use std::time::Instant;

use computer_sync::WorkspaceStats;
use computer_vfs::CheckReport;

use crate::fs_error::out_err;
use crate::fs_files::Files;
use crate::fs_format::{human_bytes, json_f64, json_string};
use crate::fs_progress::StepBar;

pub(crate) fn compact(
    files: &dyn Files,
    progress: bool,
    json: bool,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let mut bar = StepBar::bytes("compact", progress);
    let mut said_rewrite = false;
    let result = files.compact(&mut |p| {
        if p.rewriting && !said_rewrite && progress {
            said_rewrite = true;
            let _ = writeln!(
                stderr,
                "computerd: compact: rewriting the database once, to give space back in \
                 steps from now on (it was made before that was possible)"
            );
        }
        bar.update(p.freed_bytes, p.free_bytes_at_start);
    });
    bar.finish();
    let report = result?;
    let secs = start.elapsed().as_secs_f64();
    let line = if json {
        format!(
            "{{\"bytes_before\":{},\"bytes_after\":{},\"rewrote\":{},\"seconds\":{}}}",
            report.bytes_before,
            report.bytes_after,
            report.rewrote,
            json_f64(secs)
        )
    } else {
        format!(
            "compacted: {} to {} ({} given back) in {secs:.2} s",
            human_bytes(report.bytes_before),
            human_bytes(report.bytes_after),
            human_bytes(report.bytes_before.saturating_sub(report.bytes_after)),
        )
    };
    writeln!(stdout, "{line}").map_err(out_err)?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn check(
    files: &dyn Files,
    progress: bool,
    json: bool,
    stdout: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let start = Instant::now();
    let mut bar = StepBar::blocks("check", progress);
    let result = files.check(&mut |p| bar.update(p.blocks_done, p.blocks_total));
    bar.finish();
    let report = result?;
    let seconds = start.elapsed().as_secs_f64();
    let mut out = BufWriter::new(stdout);
    if json {
        check_json(&report, seconds, &mut out)?;
    } else {
        check_text(&report, seconds, &mut out)?;
    }
    out.flush().map_err(out_err)?;
    Ok(if report.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn check_json(report: &CheckReport, seconds: f64, out: &mut dyn Write) -> anyhow::Result<()> {
    let problems: Vec<String> = report
        .problems
        .iter()
        .map(|p| json_string(&p.to_string()))
        .collect();
    writeln!(
        out,
        "{{\"ok\":{},\"nodes\":{},\"blocks\":{},\"block_bytes\":{},\"problems\":[{}],\
         \"problems_unlisted\":{},\"seconds\":{}}}",
        report.is_ok(),
        report.nodes,
        report.blocks,
        report.block_bytes,
        problems.join(","),
        report.problems_unlisted,
        json_f64(seconds),
    )
    .map_err(out_err)
}

/// Each problem on its line, then a verdict.
fn check_text(report: &CheckReport, seconds: f64, out: &mut dyn Write) -> anyhow::Result<()> {
    for problem in &report.problems {
        writeln!(out, "{problem}").map_err(out_err)?;
    }
    if report.problems_unlisted > 0 {
        writeln!(out, "... and {} more problems", report.problems_unlisted).map_err(out_err)?;
    }
    let verdict = match report.problems.len() + report.problems_unlisted {
        0 => "no problems".to_owned(),
        1 => "1 problem".to_owned(),
        n => format!("{n} problems"),
    };
    let blocks = if report.blocks == 1 {
        "block"
    } else {
        "blocks"
    };
    writeln!(
        out,
        "checked {} nodes, {} {blocks}, {} ({} bytes) in {seconds:.2} s: {verdict}",
        report.nodes,
        report.blocks,
        human_bytes(report.block_bytes),
        report.block_bytes,
    )
    .map_err(out_err)
}

pub(crate) fn stats(
    files: &dyn Files,
    json: bool,
    stdout: &mut dyn Write,
) -> anyhow::Result<ExitCode> {
    let WorkspaceStats {
        workspace_id,
        stats: s,
    } = files.stats()?;
    let text = if json {
        format!(
            "{{\"workspace_id\":{},\"files\":{},\"directories\":{},\"symlinks\":{},\
             \"other_nodes\":{},\"logical_bytes\":{},\"unique_bytes\":{},\"stored_bytes\":{},\
             \"blocks\":{},\"dedup_ratio\":{},\"compression_ratio\":{},\"database_bytes\":{},\
             \"free_bytes\":{},\"staged_files\":{},\"revision\":{}}}\n",
            json_string(&workspace_id),
            s.files,
            s.directories,
            s.symlinks,
            s.other_nodes,
            s.logical_bytes,
            s.unique_bytes,
            s.stored_bytes,
            s.blocks,
            json_f64(s.dedup_ratio()),
            json_f64(s.compression_ratio()),
            s.database_bytes,
            s.free_bytes,
            s.staged_files,
            s.revision.0,
        )
    } else {
        let bytes = |n: u64| format!("{} ({n} bytes)", human_bytes(n));
        let rows = [
            ("files", s.files.to_string()),
            ("directories", s.directories.to_string()),
            ("symlinks", s.symlinks.to_string()),
            ("other nodes", s.other_nodes.to_string()),
            ("logical bytes", bytes(s.logical_bytes)),
            ("unique bytes", bytes(s.unique_bytes)),
            ("stored bytes", bytes(s.stored_bytes)),
            ("blocks", s.blocks.to_string()),
            ("dedup ratio", format!("{:.2}", s.dedup_ratio())),
            ("compression", format!("{:.2}", s.compression_ratio())),
            ("database bytes", bytes(s.database_bytes)),
            ("free in it", bytes(s.free_bytes)),
            ("staged files", s.staged_files.to_string()),
            ("revision", s.revision.0.to_string()),
        ];
        rows.iter()
            .map(|(key, value)| format!("{:<15} {value}\n", format!("{key}:")))
            .collect()
    };
    stdout.write_all(text.as_bytes()).map_err(out_err)?;
    stdout.flush().map_err(out_err)?;
    Ok(ExitCode::SUCCESS)
}
