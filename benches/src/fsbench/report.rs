//! The result table, as aligned text (stdout) and as markdown (`--markdown FILE`).

use super::stats::{ms, ratio, Summary};

/// Outcome of one (scenario, target) cell.
#[derive(Clone, Debug)]
pub enum Cell {
    Done(Summary),
    Failed,
}

/// One scenario's outcomes, one cell per target (in target order), or a reason it was
/// skipped.
#[derive(Clone, Debug)]
pub struct Row {
    pub scenario: String,
    pub outcome: Result<Vec<Cell>, String>,
}

/// Which ratios to show: `subject` over each of `baselines` (indices into the targets).
#[derive(Clone, Debug)]
pub struct Ratios {
    pub subject: usize,
    pub baselines: Vec<usize>,
}

/// A rendered table.
#[derive(Clone, Debug, Default)]
pub struct Table {
    pub headers: Vec<String>,
    /// Which columns are right-aligned numbers.
    pub numeric: Vec<bool>,
    pub rows: Vec<Vec<String>>,
}

fn fmt_ms(d: std::time::Duration) -> String {
    let v = ms(d);
    if v >= 10_000.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Builds the table: scenario, median ms per target, the ratios of medians, then min - max
/// per target.
pub fn table(targets: &[String], rows: &[Row], ratios: Option<&Ratios>) -> Table {
    let mut t = Table::default();
    t.headers.push("scenario".into());
    t.numeric.push(false);
    for name in targets {
        t.headers.push(format!("{name} ms"));
        t.numeric.push(true);
    }
    if let Some(r) = ratios {
        for &b in &r.baselines {
            t.headers
                .push(format!("{} / {}", targets[r.subject], targets[b]));
            t.numeric.push(true);
        }
    }
    for name in targets {
        t.headers.push(format!("{name} min - max"));
        t.numeric.push(true);
    }
    for row in rows {
        let mut out = vec![row.scenario.clone()];
        match &row.outcome {
            Err(reason) => {
                out.push(format!("skipped: {reason}"));
                out.resize(t.headers.len(), String::new());
            }
            Ok(cells) => {
                let median = |i: usize| match &cells[i] {
                    Cell::Done(s) => Some(s.median),
                    Cell::Failed => None,
                };
                for cell in cells {
                    out.push(match cell {
                        Cell::Done(s) => fmt_ms(s.median),
                        Cell::Failed => "FAIL".into(),
                    });
                }
                if let Some(r) = ratios {
                    for &b in &r.baselines {
                        let q = median(r.subject)
                            .zip(median(b))
                            .and_then(|(a, b)| ratio(a, b));
                        out.push(q.map_or("-".into(), |q| format!("{q:.2}")));
                    }
                }
                for cell in cells {
                    out.push(match cell {
                        Cell::Done(s) => format!("{} - {}", fmt_ms(s.min), fmt_ms(s.max)),
                        Cell::Failed => "FAIL".into(),
                    });
                }
            }
        }
        t.rows.push(out);
    }
    t
}

impl Table {
    /// Aligned plain text.
    pub fn to_text(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            // A "skipped" note spills over the number columns; do not widen for it.
            if row.get(1).is_some_and(|c| c.starts_with("skipped:")) {
                continue;
            }
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i > 0 {
                    s.push_str("  ");
                }
                let w = widths[i];
                if self.numeric[i] && !c.starts_with("skipped:") {
                    s.push_str(&format!("{c:>w$}"));
                } else {
                    s.push_str(&format!("{c:<w$}"));
                }
            }
            s.trim_end().to_string()
        };
        let mut out = line(&self.headers);
        out.push('\n');
        out.push_str(&"-".repeat(out.trim_end().chars().count()));
        out.push('\n');
        for row in &self.rows {
            out.push_str(&line(row));
            out.push('\n');
        }
        out
    }

    /// A markdown table.
    pub fn to_markdown(&self) -> String {
        let esc = |c: &str| c.replace('|', "\\|");
        let mut out = format!(
            "| {} |\n|{}|\n",
            self.headers
                .iter()
                .map(|h| esc(h))
                .collect::<Vec<_>>()
                .join(" | "),
            self.numeric
                .iter()
                .map(|&n| if n { "---:" } else { "---" })
                .collect::<Vec<_>>()
                .join("|")
        );
        for row in &self.rows {
            out.push_str(&format!(
                "| {} |\n",
                row.iter().map(|c| esc(c)).collect::<Vec<_>>().join(" | ")
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn done(ms: &[u64]) -> Cell {
        let v: Vec<Duration> = ms.iter().map(|&m| Duration::from_millis(m)).collect();
        Cell::Done(Summary::of(&v).unwrap())
    }

    #[test]
    fn ratio_columns_and_failures() {
        let targets = vec!["tmpfs".to_string(), "ext4".into(), "alt".into()];
        let rows = vec![
            Row {
                scenario: "a".into(),
                outcome: Ok(vec![done(&[10, 12]), done(&[20]), done(&[40])]),
            },
            Row {
                scenario: "b".into(),
                outcome: Ok(vec![done(&[10]), done(&[20]), Cell::Failed]),
            },
            Row {
                scenario: "c".into(),
                outcome: Err("npm offline".into()),
            },
        ];
        let r = Ratios {
            subject: 2,
            baselines: vec![1, 0],
        };
        let t = table(&targets, &rows, Some(&r));
        assert_eq!(t.headers[4..6], ["alt / ext4", "alt / tmpfs"]);
        assert_eq!(t.rows[0][1..6], ["11.0", "20.0", "40.0", "2.00", "3.64"]);
        assert_eq!(t.rows[0][6], "10.0 - 12.0");
        assert_eq!(t.rows[1][3..6], ["FAIL", "-", "-"]);
        assert_eq!(t.rows[2][1], "skipped: npm offline");
        let md = t.to_markdown();
        assert!(md.starts_with("| scenario | tmpfs ms |"), "{md}");
        assert_eq!(md.lines().count(), 2 + 3);
        assert!(t.to_text().lines().nth(2).unwrap().starts_with("a "));
    }
}
