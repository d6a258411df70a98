//! The policy file: what each backend may do, declared in TOML and read by the daemon.
//!
//! ```toml
//! [linux]
//! network = false              # the host's network, or only a loopback of its own
//! env_allow = ["LANG", "LC_*"] # variables a caller may pass; "*" alone: any
//! read_only = ["vendor"]       # workspace paths the sandbox sees read-only
//! timeout_seconds = 600        # the longest a command runs (a caller may ask less)
//! processes = 256              # processes of one command at once (cgroup pids)
//! memory_mib = 2048            # memory of one command (cgroup memory)
//! warm = true                  # commands join one sandbox kept warm (else one each)
//! idle_seconds = 300           # a warm sandbox unused this long is reaped
//!
//! [shell]
//! commands = ["cat", "grep"]   # commands it may run (default: all it implements)
//! read = ["**"]                # workspace paths whose contents and listings it reads
//! write = ["**"]               # workspace paths it may create, change, remove
//! timeout_seconds = 600        # the longest a script runs (a caller may ask less)
//! commands_max = 1000000       # commands one script runs
//! loop_iterations_max = 1000000
//! output_mib = 16              # stdout and stderr of one script, each
//! write_mib = 1024             # bytes one script writes to the workspace
//! read_mib = 256               # the largest file it reads (whole, into memory)
//!
//! [js]
//! imports = ["lodash"]         # bare imports besides fs (from /workspace/node_modules)
//! memory_mib = 256             # the JavaScript heap of one run
//! timeout_seconds = 600        # the longest a module runs (a caller may ask less)
//! output_mib = 16              # what the console writes in one run
//! ```
//!
//! Every key is optional; an unknown key is an error, so a misspelt limit is not
//! silently ignored.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::js::{JsLimits, JsPolicy};
use crate::linux::LinuxPolicy;
use crate::shell::{ShellLimits, ShellPolicy, LOOP_ITERATIONS_TOTAL_PER_LOOP};

/// The longest policy file read, bytes.
const POLICY_FILE_BYTES_MAX: u64 = 1 << 20;

/// A parsed policy file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    #[serde(default)]
    pub linux: LinuxSection,
    #[serde(default)]
    pub shell: ShellSection,
    #[serde(default)]
    pub js: JsSection,
}

/// The `[js]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsSection {
    pub imports: Option<Vec<String>>,
    pub memory_mib: Option<usize>,
    pub timeout_seconds: Option<f64>,
    pub output_mib: Option<usize>,
}

/// The policy of every backend, from one file.
#[derive(Clone, Debug, Default)]
pub struct Policies {
    pub linux: LinuxPolicy,
    pub shell: ShellPolicy,
    pub js: JsPolicy,
}

/// The `[shell]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShellSection {
    pub commands: Option<Vec<String>>,
    pub read: Option<Vec<String>>,
    pub write: Option<Vec<String>>,
    pub timeout_seconds: Option<f64>,
    pub commands_max: Option<usize>,
    pub loop_iterations_max: Option<usize>,
    pub output_mib: Option<usize>,
    pub write_mib: Option<u64>,
    pub read_mib: Option<u64>,
}

/// The `[linux]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinuxSection {
    pub network: Option<bool>,
    pub env_allow: Option<Vec<String>>,
    pub read_only: Option<Vec<String>>,
    pub timeout_seconds: Option<f64>,
    pub processes: Option<u64>,
    pub memory_mib: Option<u64>,
    pub bwrap: Option<PathBuf>,
    pub warm: Option<bool>,
    pub idle_seconds: Option<f64>,
}

impl PolicyFile {
    /// The Linux backend's policy from the file at `path`, or the default without one.
    pub fn linux_policy_at(path: Option<&Path>) -> Result<LinuxPolicy> {
        Ok(match path {
            Some(path) => PolicyFile::load(path)?.linux_policy(),
            None => LinuxPolicy::default(),
        })
    }

    /// Every backend's policy from the file at `path`, or the defaults without one.
    pub fn policies_at(path: Option<&Path>) -> Result<Policies> {
        Ok(match path {
            Some(path) => {
                let file = PolicyFile::load(path)?;
                Policies {
                    linux: file.linux_policy(),
                    shell: file.shell_policy(),
                    js: file.js_policy(),
                }
            }
            None => Policies::default(),
        })
    }

    /// Reads and checks the policy file at `path`.
    pub fn load(path: &Path) -> Result<PolicyFile> {
        use std::io::Read;
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|file| file.take(POLICY_FILE_BYTES_MAX).read_to_string(&mut text))
            .map_err(Error::io(format!(
                "reading the policy file {}",
                path.display()
            )))?;
        PolicyFile::parse(&text)
            .map_err(|why| Error::Invalid(format!("policy file {}: {why}", path.display())))
    }

    /// Parses a policy; the error is one line.
    pub fn parse(text: &str) -> std::result::Result<PolicyFile, String> {
        let policy: PolicyFile = toml::from_str(text).map_err(|err| {
            let message = err.message().to_owned();
            match err.span() {
                Some(span) => {
                    let line = text[..span.start].matches('\n').count() + 1;
                    format!("line {line}: {message}")
                }
                None => message,
            }
        })?;
        policy.linux.check()?;
        policy.shell.check()?;
        policy.js.check()?;
        Ok(policy)
    }

    /// The js backend's policy: the file's values over the defaults.
    pub fn js_policy(&self) -> JsPolicy {
        let section = &self.js;
        let default = JsLimits::default();
        JsPolicy {
            imports: section.imports.clone().unwrap_or_default(),
            limits: JsLimits {
                memory_bytes_max: (section.memory_mib.map(|mib| mib << 20))
                    .unwrap_or(default.memory_bytes_max),
                output_bytes_max: (section.output_mib.map(|mib| mib << 20))
                    .unwrap_or(default.output_bytes_max),
                timeout: section.timeout_seconds.map(Duration::from_secs_f64),
                ..default
            },
        }
    }

    /// The shell backend's policy: the file's values over the defaults.
    pub fn shell_policy(&self) -> ShellPolicy {
        self.shell.to_policy(ShellPolicy::default())
    }

    /// The Linux backend's policy: the file's values over the defaults.
    pub fn linux_policy(&self) -> LinuxPolicy {
        let section = &self.linux;
        let default = LinuxPolicy::default();
        LinuxPolicy {
            network: section.network.unwrap_or(default.network),
            env_allow: section.env_allow.clone().unwrap_or(default.env_allow),
            read_only: section.read_only.clone().unwrap_or(default.read_only),
            bwrap: section.bwrap.clone().unwrap_or(default.bwrap),
            timeout: section.timeout_seconds.map(Duration::from_secs_f64),
            processes_max: section.processes,
            memory_bytes_max: section.memory_mib.map(|mib| mib << 20),
            warm: section.warm.unwrap_or(default.warm),
            sandbox_idle: (section.idle_seconds)
                .map_or(default.sandbox_idle, Duration::from_secs_f64),
        }
    }
}

/// `seconds`, if given, as a duration: positive and finite.
fn positive_seconds(key: &str, seconds: Option<f64>) -> std::result::Result<(), String> {
    match seconds {
        Some(s) if !(s > 0.0 && Duration::try_from_secs_f64(s).is_ok()) => {
            Err(format!("{key} = {s}: a positive number of seconds"))
        }
        _ => Ok(()),
    }
}

impl JsSection {
    fn check(&self) -> std::result::Result<(), String> {
        positive_seconds("js.timeout_seconds", self.timeout_seconds)?;
        let mib = [self.memory_mib, self.output_mib];
        if mib.contains(&Some(0)) || mib.iter().flatten().any(|&mib| mib > 1 << 20) {
            return Err("js.memory_mib and js.output_mib: from 1 to 2^20".into());
        }
        for name in self.imports.iter().flatten() {
            let plain = name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c));
            if name.is_empty() || name.starts_with('.') || !plain {
                return Err(format!("js.imports: {name:?} is not a bare module name"));
            }
        }
        Ok(())
    }
}

impl ShellSection {
    fn check(&self) -> std::result::Result<(), String> {
        positive_seconds("shell.timeout_seconds", self.timeout_seconds)?;
        let zero = [self.commands_max, self.loop_iterations_max, self.output_mib];
        if zero.contains(&Some(0)) || self.write_mib == Some(0) || self.read_mib == Some(0) {
            return Err("shell limits: at least 1".into());
        }
        if self.output_mib.is_some_and(|mib| mib > 1 << 10)
            || self.write_mib.is_some_and(|mib| mib > 1 << 30)
            || self.read_mib.is_some_and(|mib| mib > 1 << 20)
        {
            return Err(
                "shell.output_mib: at most 1024; write_mib: at most 2^30; read_mib: at most 2^20"
                    .into(),
            );
        }
        let shell = self.to_policy(ShellPolicy::default());
        shell.path_rules().map(drop)
    }

    fn to_policy(&self, default: ShellPolicy) -> ShellPolicy {
        let limits = ShellLimits {
            commands_max: self.commands_max.unwrap_or(default.limits.commands_max),
            loop_iterations_max: (self.loop_iterations_max)
                .unwrap_or(default.limits.loop_iterations_max),
            loop_iterations_total_max: (self.loop_iterations_max)
                .map_or(default.limits.loop_iterations_total_max, |max| {
                    max.saturating_mul(LOOP_ITERATIONS_TOTAL_PER_LOOP)
                }),
            output_bytes_max: (self.output_mib.map(|mib| mib << 20))
                .unwrap_or(default.limits.output_bytes_max),
            write_bytes_max: (self.write_mib.map(|mib| mib << 20))
                .unwrap_or(default.limits.write_bytes_max),
            read_bytes_max: (self.read_mib.map(|mib| mib << 20))
                .unwrap_or(default.limits.read_bytes_max),
            timeout: self.timeout_seconds.map(Duration::from_secs_f64),
        };
        ShellPolicy {
            commands: self.commands.as_ref().map(|c| c.iter().cloned().collect()),
            read: self.read.clone().unwrap_or(default.read),
            write: self.write.clone().unwrap_or(default.write),
            limits,
        }
    }
}

impl LinuxSection {
    fn check(&self) -> std::result::Result<(), String> {
        positive_seconds("linux.timeout_seconds", self.timeout_seconds)?;
        positive_seconds("linux.idle_seconds", self.idle_seconds)?;
        if self.processes == Some(0) || self.memory_mib == Some(0) {
            return Err("linux.processes and linux.memory_mib: at least 1".into());
        }
        if self.memory_mib.is_some_and(|mib| mib > (1 << 40)) {
            return Err("linux.memory_mib: at most 2^40".into());
        }
        for path in self.read_only.iter().flatten() {
            crate::spine::normalize_cwd(path)
                .map_err(|_| format!("linux.read_only: {path:?} climbs out of the workspace"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_file_sets_what_it_names_and_defaults_the_rest() {
        let policy = PolicyFile::parse(
            "[linux]\nnetwork = true\nenv_allow = [\"LC_*\"]\ntimeout_seconds = 1.5\nmemory_mib = 64\n",
        )
        .unwrap()
        .linux_policy();
        assert!(policy.network);
        assert_eq!(policy.env_allow, vec!["LC_*".to_string()]);
        assert_eq!(policy.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(policy.memory_bytes_max, Some(64 << 20));
        assert_eq!(policy.processes_max, None);
        assert!(policy.read_only.is_empty());
        let empty = PolicyFile::parse("").unwrap().linux_policy();
        assert!(!empty.network);
        let shell =
            PolicyFile::parse("[shell]\ncommands = [\"cat\"]\nwrite = []\noutput_mib = 2\n")
                .unwrap()
                .shell_policy();
        assert!(shell.allows("cat") && !shell.allows("grep"));
        assert!(shell.write.is_empty());
        assert_eq!(shell.read, vec!["**".to_string()]);
        assert_eq!(shell.limits.output_bytes_max, 2 << 20);
        assert_eq!(
            shell.limits.commands_max,
            ShellLimits::default().commands_max
        );
    }

    #[test]
    fn mistakes_are_one_line_naming_where() {
        let typo = PolicyFile::parse("[linux]\nnetwork = false\nmemory_mb = 3\n").unwrap_err();
        assert!(typo.starts_with("line 3:"), "{typo}");
        assert!(typo.contains("memory_mb"), "{typo}");
        assert!(!typo.contains('\n'), "{typo}");
        assert!(PolicyFile::parse("[linux]\ntimeout_seconds = -1\n").is_err());
        assert!(PolicyFile::parse("[linux]\nprocesses = 0\n").is_err());
        assert!(PolicyFile::parse("[linux]\nread_only = [\"../x\"]\n").is_err());
        assert!(PolicyFile::parse("[linux\n").is_err());
        assert!(PolicyFile::parse("[shell]\nwrite = [\"a[\"]\n").is_err());
        assert!(PolicyFile::parse("[shell]\noutput_mib = 0\n").is_err());
        assert!(PolicyFile::parse("[shell]\ncomand = []\n").is_err());
        assert!(PolicyFile::parse("[js]\nimports = [\"../x\"]\n").is_err());
        assert!(PolicyFile::parse("[js]\nmemory_mib = 0\n").is_err());
        let js = PolicyFile::parse("[js]\nimports = [\"lodash\"]\nmemory_mib = 8\n")
            .unwrap()
            .js_policy();
        assert_eq!(js.imports, vec!["lodash".to_string()]);
        assert_eq!(js.limits.memory_bytes_max, 8 << 20);
    }
}
