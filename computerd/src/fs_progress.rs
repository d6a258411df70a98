//! Progress on stderr for long `computerd fs` commands (import, export, check, compact).
//!
//! On a terminal: an indicatif bar. Elsewhere (a log, a pipe) a bar cannot be drawn, so a
//! large transfer prints a plain progress line every few seconds instead and a small one
//! prints nothing. Either way the command ends with its own one-line summary.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use computer_vfs::transfer::Progress;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::fs_format::human_bytes;

/// A tree at least this large gets progress lines even when stderr is not a terminal.
const LARGE_FILES: u64 = 10_000;
const LARGE_BYTES: u64 = 1 << 30;
/// How often progress lines are printed when stderr is not a terminal.
const LINE_INTERVAL: Duration = Duration::from_secs(5);

enum Display {
    /// Not decided yet: waiting for the first report, which carries the totals.
    Undecided,
    Bar(ProgressBar),
    Lines {
        last: Instant,
    },
    Nothing,
}

/// Shows the progress of an import or export.
pub struct TransferProgress {
    verb: &'static str,
    enabled: bool,
    display: Display,
}

impl TransferProgress {
    /// `verb` names the operation in progress lines ("import", "export").
    pub fn new(verb: &'static str, enabled: bool) -> TransferProgress {
        TransferProgress {
            verb,
            enabled,
            display: Display::Undecided,
        }
    }

    /// Called by `computer_vfs::transfer` at every step.
    pub fn update(&mut self, p: &Progress) {
        if let Display::Undecided = self.display {
            self.display = self.choose(p);
        }
        match &mut self.display {
            Display::Bar(bar) => {
                bar.set_length(p.bytes_total.max(p.bytes_done));
                bar.set_position(p.bytes_done);
                bar.set_message(format!("{}/{} files", p.files_done, p.files_total));
            }
            Display::Lines { last } => {
                let done = p.files_total > 0 && p.files_done >= p.files_total;
                if last.elapsed() >= LINE_INTERVAL || done {
                    *last = Instant::now();
                    eprintln!(
                        "computerd: {}: {}/{} files, {} of {}",
                        self.verb,
                        p.files_done,
                        p.files_total,
                        human_bytes(p.bytes_done),
                        human_bytes(p.bytes_total)
                    );
                }
            }
            Display::Undecided | Display::Nothing => {}
        }
    }

    fn choose(&self, p: &Progress) -> Display {
        if !self.enabled {
            return Display::Nothing;
        }
        if std::io::stderr().is_terminal() {
            let bar =
                ProgressBar::with_draw_target(Some(p.bytes_total), ProgressDrawTarget::stderr());
            let template = "{prefix} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} \
                            ({bytes_per_sec}, {eta}) {msg}";
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(self.verb);
            bar.enable_steady_tick(Duration::from_millis(200));
            return Display::Bar(bar);
        }
        if p.files_total >= LARGE_FILES || p.bytes_total >= LARGE_BYTES {
            // The first line comes after one interval, not at once.
            return Display::Lines {
                last: Instant::now(),
            };
        }
        Display::Nothing
    }

    /// Removes the bar (before the summary is printed).
    pub fn finish(self) {
        if let Display::Bar(bar) = self.display {
            bar.finish_and_clear();
        }
    }
}

/// Shows the progress of a step-by-step command on a terminal only: `check` (blocks
/// verified), `compact` (bytes given back).
pub struct StepBar {
    bar: Option<ProgressBar>,
}

impl StepBar {
    /// `check`'s bar: blocks verified of all blocks.
    pub fn blocks(verb: &str, enabled: bool) -> StepBar {
        StepBar::new(
            enabled,
            &format!("{verb} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} blocks ({{eta}})"),
        )
    }

    /// A bar of bytes done of all bytes.
    pub fn bytes(verb: &str, enabled: bool) -> StepBar {
        StepBar::new(
            enabled,
            &format!(
                "{verb} [{{elapsed_precise}}] {{wide_bar}} {{bytes}}/{{total_bytes}} ({{eta}})"
            ),
        )
    }

    fn new(enabled: bool, template: &str) -> StepBar {
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::with_template(template) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        StepBar { bar }
    }

    pub fn update(&mut self, done: u64, total: u64) {
        if let Some(bar) = &self.bar {
            bar.set_length(total.max(done));
            bar.set_position(done);
        }
    }

    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}
