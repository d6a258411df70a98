//! Text formatting shared by the `computerd fs` commands: times, modes, sizes, JSON.

use computer_vfs::{FileKind, TimestampNs};

const NS_PER_SEC: i64 = 1_000_000_000;

/// Year, month (1-12) and day (1-31) of a day count since 1970-01-01 (proleptic
/// Gregorian; Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

struct Civil {
    year: i64,
    month: u32,
    day: u32,
    hour: i64,
    minute: i64,
    second: i64,
    nanos: i64,
}

fn civil(ns: TimestampNs) -> Civil {
    let secs = ns.div_euclid(NS_PER_SEC);
    let nanos = ns.rem_euclid(NS_PER_SEC);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    Civil {
        year,
        month,
        day,
        hour: sod / 3600,
        minute: sod % 3600 / 60,
        second: sod % 60,
        nanos,
    }
}

/// RFC 3339 in UTC with nanoseconds: `2024-05-01T12:34:56.123456789Z`.
pub fn rfc3339_ns(ns: TimestampNs) -> String {
    let c = civil(ns);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}Z",
        c.year, c.month, c.day, c.hour, c.minute, c.second, c.nanos
    )
}

/// A short UTC time for listings: `2024-05-01 12:34`.
pub fn short_time(ns: TimestampNs) -> String {
    let c = civil(ns);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}",
        c.year, c.month, c.day, c.hour, c.minute
    )
}

/// The `ls -l` type letter of a kind.
pub fn kind_char(kind: FileKind) -> char {
    match kind {
        FileKind::File => '-',
        FileKind::Directory => 'd',
        FileKind::Symlink => 'l',
        FileKind::Fifo => 'p',
        FileKind::Socket => 's',
        FileKind::CharDevice => 'c',
        FileKind::BlockDevice => 'b',
    }
}

/// A kind in words, as `stat` shows it.
pub fn kind_name(kind: FileKind) -> &'static str {
    match kind {
        FileKind::File => "regular file",
        FileKind::Directory => "directory",
        FileKind::Symlink => "symbolic link",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
        FileKind::CharDevice => "character device",
        FileKind::BlockDevice => "block device",
    }
}

/// `drwxr-xr-x`: the type letter and the permission bits, with setuid, setgid and sticky.
pub fn mode_string(kind: FileKind, perm: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(kind_char(kind));
    let special = [(0o4000, 's'), (0o2000, 's'), (0o1000, 't')];
    for (i, (special_bit, special_char)) in special.iter().enumerate() {
        let shift = 6 - 3 * i as u32;
        let bits = (perm >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        let exec = bits & 1 != 0;
        s.push(match (perm & special_bit != 0, exec) {
            (true, true) => *special_char,
            (true, false) => special_char.to_ascii_uppercase(),
            (false, true) => 'x',
            (false, false) => '-',
        });
    }
    s
}

/// Bytes in binary units: `512 B`, `1.5 KiB`, `3.2 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// A string as a JSON string literal.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A float as a JSON number (`null` if it is not finite).
pub fn json_f64(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".to_owned()
    }
}

/// Parses a whole number of bytes with an optional binary suffix: `100`, `4K` (4096),
/// `2M`, `3G`, `1T`, `1P`; `KiB`- and `KB`-style spellings mean the same.
pub fn parse_size(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    if digits == 0 {
        return None;
    }
    let number: u64 = text[..digits].parse().ok()?;
    let shift = match text[digits..].to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        "P" | "PB" | "PIB" => 50,
        _ => return None,
    };
    number.checked_mul(1u64 << shift)
}

/// Parses an octal permission mode (`755`, `0644`, `0o4755`).
pub fn parse_mode(text: &str) -> Option<u32> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
    {
        return None;
    }
    let mode = u32::from_str_radix(digits, 8).ok()?;
    (mode <= 0o7777).then_some(mode)
}

/// The directory holding a path's last component (`/a/b` -> `/a`, `/a` -> `/`).
pub fn parent_dir(path: &str) -> &str {
    let trimmed = path.trim_end_matches('/');
    match trimmed.rfind('/') {
        Some(0) | None => "/",
        Some(at) => &trimmed[..at],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_times_in_utc_with_nanoseconds() {
        assert_eq!(rfc3339_ns(0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            rfc3339_ns(1_700_000_000_123_456_789),
            "2023-11-14T22:13:20.123456789Z"
        );
        assert_eq!(rfc3339_ns(-1), "1969-12-31T23:59:59.999999999Z");
        assert_eq!(
            rfc3339_ns(951_782_400 * NS_PER_SEC),
            "2000-02-29T00:00:00.000000000Z"
        );
        assert_eq!(short_time(1_700_000_000 * NS_PER_SEC), "2023-11-14 22:13");
        // The extremes of the type do not panic.
        let _ = rfc3339_ns(i64::MIN);
        let _ = rfc3339_ns(i64::MAX);
    }

    #[test]
    fn formats_modes() {
        assert_eq!(mode_string(FileKind::Directory, 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(FileKind::File, 0o644), "-rw-r--r--");
        assert_eq!(mode_string(FileKind::File, 0o4755), "-rwsr-xr-x");
        assert_eq!(mode_string(FileKind::Directory, 0o1777), "drwxrwxrwt");
        assert_eq!(mode_string(FileKind::File, 0o2644), "-rw-r-Sr--");
        assert_eq!(mode_string(FileKind::Symlink, 0o777), "lrwxrwxrwx");
    }

    #[test]
    fn formats_sizes_and_json() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(u64::MAX), "16.0 EiB");
        assert_eq!(json_string("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
        assert_eq!(json_f64(2.5), "2.5");
        assert_eq!(json_f64(f64::NAN), "null");
    }

    #[test]
    fn parses_sizes_and_modes() {
        assert_eq!(parse_size("0"), Some(0));
        assert_eq!(parse_size("4K"), Some(4096));
        assert_eq!(parse_size("2MiB"), Some(2 << 20));
        assert_eq!(parse_size("-1"), None);
        assert_eq!(parse_size("K"), None);
        assert_eq!(parse_size("99999999999999999999"), None);
        assert_eq!(parse_size("20000P"), None);
        assert_eq!(parse_mode("755"), Some(0o755));
        assert_eq!(parse_mode("0o4755"), Some(0o4755));
        assert_eq!(parse_mode("8"), None);
        assert_eq!(parse_mode("17777"), None);
        assert_eq!(parse_mode(""), None);
        assert_eq!(parse_mode("u+x"), None);
    }
}
