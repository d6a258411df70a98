//! `sleep` as coreutils has it: bashkit's own stops at 60 seconds without saying so, and
//! a script that waits on purpose must wait as long as it asked (its exec's timeout and
//! kill still end it at once: the wait is an await the exec's future is dropped at).

use std::time::Duration;

use bashkit::{async_trait, Builtin, BuiltinContext, ExecResult};

/// The `sleep` command of the shell.
pub(crate) struct Sleep;

#[async_trait]
impl Builtin for Sleep {
    async fn execute(&self, ctx: BuiltinContext<'_>) -> bashkit::Result<ExecResult> {
        if ctx.args.is_empty() {
            return Ok(ExecResult::err("sleep: missing operand\n", 1));
        }
        let mut total = Duration::ZERO;
        for arg in ctx.args {
            match interval(arg) {
                Some(interval) => total = total.saturating_add(interval),
                None => {
                    let message = format!("sleep: invalid time interval '{arg}'\n");
                    return Ok(ExecResult::err(message, 1));
                }
            }
        }
        tokio::time::sleep(total).await;
        Ok(ExecResult::ok(""))
    }
}

/// `1.5`, `2m`, `1h`, `3d`, `inf`: as GNU sleep reads an interval.
fn interval(text: &str) -> Option<Duration> {
    let (number, unit) = match text.char_indices().last()? {
        (at, 's' | 'm' | 'h' | 'd') if !text.starts_with("inf") => text.split_at(at),
        _ => (text, ""),
    };
    let scale = match unit {
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86400.0,
        _ => return None,
    };
    let seconds: f64 = number.parse().ok()?;
    if seconds.is_nan() || seconds < 0.0 {
        return None;
    }
    Some(Duration::try_from_secs_f64(seconds * scale).unwrap_or(Duration::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_read_as_gnu_sleep_reads_them() {
        assert_eq!(interval("1.5"), Some(Duration::from_millis(1500)));
        assert_eq!(interval("2m"), Some(Duration::from_secs(120)));
        assert_eq!(interval("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(interval("0.5d"), Some(Duration::from_secs(43200)));
        assert_eq!(interval("inf"), Some(Duration::MAX));
        assert_eq!(interval("infinity"), Some(Duration::MAX));
        assert_eq!(interval("-1"), None);
        assert_eq!(interval("x"), None);
        assert_eq!(interval("5y"), None);
    }
}
