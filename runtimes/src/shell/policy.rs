//! What the shell backend may do: the commands it runs, the workspace paths it reads
//! and writes, and the limits of one exec (the `[shell]` table of the policy file).

use std::collections::BTreeSet;
use std::time::Duration;

use globset::{Glob, GlobSet, GlobSetBuilder};

/// Commands the shell implements but never runs: they would reach the network (the
/// shell has none) or pretend to be a host it is not.
pub const COMMANDS_NEVER: &[&str] = &[
    "curl", "wget", "http", "ssh", "scp", "sftp", "ping", "nc", "sudo", "doas", "su",
];

/// The limits of one exec on the shell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShellLimits {
    /// Commands run (each simple command, builtins and functions alike).
    pub commands_max: usize,
    /// Iterations of one loop, and of all loops together.
    pub loop_iterations_max: usize,
    pub loop_iterations_total_max: usize,
    /// Bytes of standard output, and of standard error, each.
    pub output_bytes_max: usize,
    /// Bytes the exec may write to the workspace (file contents, copies included).
    pub write_bytes_max: u64,
    /// The largest file it reads (bashkit reads a file whole into memory).
    pub read_bytes_max: u64,
    /// Wall time; `None`: the caller's timeout alone.
    pub timeout: Option<Duration>,
}

/// All loops of one exec together may iterate this many times one loop's limit.
pub const LOOP_ITERATIONS_TOTAL_PER_LOOP: usize = 10;

/// Function calls nested in one exec: bashkit's own ceiling, which no setting raises.
pub const FUNCTION_DEPTH_MAX: usize = 16;

impl Default for ShellLimits {
    fn default() -> ShellLimits {
        ShellLimits {
            commands_max: 1_000_000,
            loop_iterations_max: 1_000_000,
            loop_iterations_total_max: 1_000_000 * LOOP_ITERATIONS_TOTAL_PER_LOOP,
            output_bytes_max: 16 << 20,
            write_bytes_max: 1 << 30,
            read_bytes_max: 256 << 20,
            timeout: None,
        }
    }
}

/// The shell backend's policy.
#[derive(Clone, Debug)]
pub struct ShellPolicy {
    /// The commands it may run; `None`: every one it implements but [`COMMANDS_NEVER`].
    pub commands: Option<BTreeSet<String>>,
    /// Globs over workspace paths (relative to its root, `src/**`): whose contents and
    /// listings commands may read, and which they may create, change or remove.
    pub read: Vec<String>,
    pub write: Vec<String>,
    pub limits: ShellLimits,
}

impl Default for ShellPolicy {
    fn default() -> ShellPolicy {
        ShellPolicy {
            commands: None,
            read: vec!["**".into()],
            write: vec!["**".into()],
            limits: ShellLimits::default(),
        }
    }
}

impl ShellPolicy {
    /// Whether the policy lets the shell run `name`, a command it implements.
    pub fn allows(&self, name: &str) -> bool {
        if COMMANDS_NEVER.contains(&name) {
            return false;
        }
        self.commands
            .as_ref()
            .is_none_or(|allowed| allowed.contains(name))
    }

    pub(crate) fn path_rules(&self) -> Result<PathRules, String> {
        Ok(PathRules {
            read: glob_set(&self.read, "shell.read")?,
            write: glob_set(&self.write, "shell.write")?,
        })
    }
}

/// The policy's path globs, compiled.
#[derive(Debug)]
pub(crate) struct PathRules {
    read: GlobSet,
    write: GlobSet,
}

impl PathRules {
    /// `path` is absolute from the workspace root.
    pub(crate) fn check_read(&self, path: &str) -> Result<(), String> {
        check(&self.read, path, "reading")
    }

    pub(crate) fn check_write(&self, path: &str) -> Result<(), String> {
        check(&self.write, path, "changing")
    }
}

fn check(set: &GlobSet, path: &str, what: &str) -> Result<(), String> {
    let relative = path.trim_start_matches('/');
    let relative = if relative.is_empty() { "." } else { relative };
    if set.is_match(relative) {
        Ok(())
    } else {
        Err(format!(
            "{what} /workspace/{} is not allowed by the shell's policy",
            relative.trim_start_matches('.')
        ))
    }
}

fn glob_set(globs: &[String], key: &str) -> Result<GlobSet, String> {
    let mut set = GlobSetBuilder::new();
    for glob in globs {
        let compiled = globset::GlobBuilder::new(glob)
            .literal_separator(true)
            .build()
            .map_err(|err| format!("{key}: {glob:?}: {err}"))?;
        set.add(compiled);
        if glob == "**" {
            // The root itself, which `**` over relative paths does not name.
            set.add(Glob::new(".").expect("a literal glob"));
        }
    }
    set.build().map_err(|err| format!("{key}: {err}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_rules_match_workspace_paths() {
        let policy = ShellPolicy {
            read: vec!["**".into()],
            write: vec!["out/**".into(), "*.log".into()],
            ..ShellPolicy::default()
        };
        let rules = policy.path_rules().unwrap();
        assert!(rules.check_read("/").is_ok());
        assert!(rules.check_read("/src/a/b.rs").is_ok());
        assert!(rules.check_write("/out/x/y").is_ok());
        assert!(rules.check_write("/run.log").is_ok());
        assert!(rules.check_write("/src/run.log").is_err());
        let refused = rules.check_write("/src/main.rs").unwrap_err();
        assert_eq!(
            refused,
            "changing /workspace/src/main.rs is not allowed by the shell's policy"
        );
    }

    #[test]
    fn network_commands_are_never_allowed() {
        let policy = ShellPolicy::default();
        assert!(policy.allows("grep"));
        assert!(!policy.allows("curl"));
        let only = ShellPolicy {
            commands: Some(["cat".to_string()].into()),
            ..ShellPolicy::default()
        };
        assert!(only.allows("cat"));
        assert!(!only.allows("grep"));
    }
}
