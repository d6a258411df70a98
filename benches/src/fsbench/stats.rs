//! Order statistics over timed samples. Computed in Rust on nanosecond integers, never in
//! awk (mawk clamps `%d` at 2^31, so anything over 2.147 s came out wrong there).

use std::time::Duration;

/// Summary of the timed samples of one (scenario, target) cell.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub median: Duration,
    pub mean: Duration,
    pub min: Duration,
    pub max: Duration,
}

impl Summary {
    /// Summarises `samples`; `None` when there are none.
    pub fn of(samples: &[Duration]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut ns: Vec<u128> = samples.iter().map(Duration::as_nanos).collect();
        ns.sort_unstable();
        let n = ns.len();
        let median = if n % 2 == 1 {
            ns[n / 2]
        } else {
            (ns[n / 2 - 1] + ns[n / 2]) / 2
        };
        let mean = ns.iter().sum::<u128>() / n as u128;
        Some(Summary {
            n,
            median: from_nanos(median),
            mean: from_nanos(mean),
            min: from_nanos(ns[0]),
            max: from_nanos(ns[n - 1]),
        })
    }
}

fn from_nanos(ns: u128) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

/// Milliseconds as a float, for printing.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `a / b` of two durations; `None` when `b` is zero.
pub fn ratio(a: Duration, b: Duration) -> Option<f64> {
    if b.is_zero() {
        None
    } else {
        Some(a.as_secs_f64() / b.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn empty_has_no_summary() {
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn odd_and_even_medians() {
        let s = Summary::of(&[d(30), d(10), d(20)]).unwrap();
        assert_eq!(
            (s.median, s.min, s.max, s.mean, s.n),
            (d(20), d(10), d(30), d(20), 3)
        );
        let s = Summary::of(&[d(40), d(10), d(20), d(30)]).unwrap();
        assert_eq!(s.median, d(25));
    }

    #[test]
    fn long_samples_are_not_clamped() {
        // The mawk bug: 2^31 ns = 2.147 s. Samples far beyond that must survive.
        let s = Summary::of(&[Duration::from_secs(124), Duration::from_secs(3)]).unwrap();
        assert_eq!(s.max, Duration::from_secs(124));
        assert_eq!(s.median, Duration::from_millis(63_500));
    }

    #[test]
    fn ratios() {
        assert_eq!(ratio(d(30), d(0)), None);
        assert!((ratio(d(30), d(10)).unwrap() - 3.0).abs() < 1e-9);
    }
}
