//! Whether the shell can run a script, decided from its text alone: the reason `auto`
//! gives for its choice, and the refusal of a script sent to the shell by name.
//!
//! A script is the shell's when it parses, hides no command (no `eval`, `source`,
//! nested `bash`, or command named by a variable), names only commands the shell
//! implements and its policy allows (also those run by `xargs`, `env`, `timeout` and
//! the like, and by `find -exec`), and names no absolute path outside the workspace
//! and `/tmp`. The same text always gets the same answer.

use std::collections::BTreeSet;

use bashkit::analysis::{self, AnalyzedCommand, ScriptAnalysis};

use super::policy::ShellPolicy;
use crate::linux::SANDBOX_WORKSPACE;

/// Absolute paths a script may name and still run on the shell.
const PATHS_OF_THE_SHELL: &[&str] = &[SANDBOX_WORKSPACE, "/tmp", "/dev/null"];

/// Commands that run the command named by their first operand, with their options
/// that take a value (the word after them is not the command).
const WRAPPERS: &[(&str, &[&str])] = &[
    ("command", &[]),
    (
        "env",
        &["-u", "--unset", "-C", "--chdir", "-S", "--split-string"],
    ),
    ("exec", &["-a"]),
    ("nice", &["-n", "--adjustment"]),
    ("nohup", &[]),
    ("setsid", &[]),
    ("stdbuf", &["-i", "-o", "-e"]),
    ("timeout", &["-s", "--signal", "-k", "--kill-after"]),
    (
        "xargs",
        &[
            "-a",
            "-d",
            "-E",
            "-I",
            "-L",
            "-n",
            "-P",
            "-s",
            "--arg-file",
            "--delimiter",
            "--max-args",
            "--max-lines",
            "--max-procs",
            "--max-chars",
        ],
    ),
];

/// Why the shell is not the place for a script.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Unfit {
    /// It does not parse (bash then says where).
    Parse(String),
    /// It hides commands until it runs.
    Opaque(String),
    /// It names a command the shell does not implement or may not run.
    Command(String),
    /// It names a path outside the workspace and `/tmp`.
    Path(String),
}

impl Unfit {
    /// Whether a script sent to the shell by name is refused for this: a command the
    /// shell lacks or may not run. What analysis cannot see is checked as it runs, and
    /// a path outside the workspace is one of the shell's own namespace (its synthetic
    /// `/etc`, or nothing), never the host's.
    pub(crate) fn refuses_explicit_use(&self) -> bool {
        matches!(self, Unfit::Command(_))
    }
}

impl std::fmt::Display for Unfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unfit::Parse(why) | Unfit::Opaque(why) | Unfit::Command(why) | Unfit::Path(why) => {
                f.write_str(why)
            }
        }
    }
}

/// `Ok` if the shell can run `script`; else why not.
pub(crate) fn shell_can_run(
    script: &str,
    implemented: &BTreeSet<String>,
    policy: &ShellPolicy,
) -> Result<(), Unfit> {
    let analysis = analysis::analyze(script).map_err(|err| {
        Unfit::Parse(format!(
            "the script does not parse here ({})",
            one_line(&err)
        ))
    })?;
    if analysis.is_opaque() {
        return Err(Unfit::Opaque(opaque_reason(&analysis)));
    }
    let defined: BTreeSet<&str> = analysis.functions.iter().map(String::as_str).collect();
    for command in &analysis.commands {
        for name in commands_run_by(command) {
            let name = name.map_err(Unfit::Opaque)?;
            if defined.contains(name) {
                continue;
            }
            if name.contains('/') {
                let why = format!("the script runs {name}, a program known only when it runs");
                return Err(Unfit::Opaque(why));
            }
            if !implemented.contains(name) {
                let why = format!("`{name}` is not a command the shell implements");
                return Err(Unfit::Command(why));
            }
            if !policy.allows(name) {
                let why = format!("`{name}` is not allowed by the shell's policy");
                return Err(Unfit::Command(why));
            }
        }
        check_paths(path_operands(command)).map_err(Unfit::Path)?;
    }
    check_paths(analysis.redirects.iter().filter_map(|r| r.path.as_ref())).map_err(Unfit::Path)
}

fn opaque_reason(analysis: &ScriptAnalysis) -> String {
    if analysis.has_interpreter_reentry {
        "the script hands code back to an interpreter (eval, source, bash -c)".into()
    } else if analysis.has_dynamic_commands {
        "the script names a command only at run time".into()
    } else {
        "the script is too large to analyse".into()
    }
}

/// The command and those it runs through wrappers and `find -exec`; an error where one
/// of them is not known before the script runs.
fn commands_run_by(command: &AnalyzedCommand) -> Vec<Result<&str, String>> {
    let Some(name) = command.name.as_deref() else {
        return Vec::new(); // a bare assignment: analysis marks dynamic names opaque
    };
    let mut names = vec![Ok(name)];
    let base = name.rsplit('/').next().unwrap_or(name);
    if let Some((_, value_options)) = WRAPPERS.iter().find(|(wrapper, _)| *wrapper == base) {
        names.extend(wrapped_command(base, value_options, &command.args));
    }
    if base == "find" {
        names.extend(find_exec_commands(&command.args));
    }
    names
}

/// The command a wrapper runs: its first operand past options, their values and (for
/// `env`) assignments; `timeout` takes its duration first. None for `command -v`,
/// which names a command without running it.
fn wrapped_command<'a>(
    wrapper: &str,
    value_options: &[&str],
    args: &'a [Option<String>],
) -> Option<Result<&'a str, String>> {
    let mut skip_duration = wrapper == "timeout";
    let mut value_next = false;
    for arg in args {
        let Some(arg) = arg.as_deref() else {
            return Some(Err(format!(
                "`{wrapper}` runs a command named only at run time"
            )));
        };
        if std::mem::take(&mut value_next) {
            continue;
        }
        if wrapper == "command" && matches!(arg, "-v" | "-V") {
            return None;
        }
        if arg.starts_with('-') {
            value_next = value_options.contains(&arg);
            continue;
        }
        if wrapper == "env" && arg.contains('=') {
            continue;
        }
        if std::mem::take(&mut skip_duration) {
            continue;
        }
        return Some(Ok(arg));
    }
    None
}

fn find_exec_commands(args: &[Option<String>]) -> Vec<Result<&str, String>> {
    let mut out = Vec::new();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if matches!(
            arg.as_deref(),
            Some("-exec" | "-execdir" | "-ok" | "-okdir")
        ) {
            match iter.next() {
                Some(Some(command)) => out.push(Ok(command.as_str())),
                _ => out.push(Err(
                    "`find -exec` runs a command named only at run time".into()
                )),
            }
        }
    }
    out
}

/// Commands whose first operand is a pattern or a program, not a path.
const PATTERN_FIRST: &[&str] = &[
    "grep", "egrep", "fgrep", "rg", "sed", "awk", "gawk", "mawk", "nawk", "jq",
];
/// Their options that take the pattern or program as their value (then no operand is
/// one), and other options of theirs that take a value.
const PATTERN_OPTIONS: &[&str] = &["-e", "-f", "--regexp", "--file", "--expression"];
const VALUE_OPTIONS: &[&str] = &["-F", "-v", "-m", "-A", "-B", "-C", "--arg", "--argjson"];
/// Commands whose operands are text, never paths.
const TEXT_ONLY: &[&str] = &["echo", "printf", "basename", "dirname", "expr", "seq"];

/// The words of `command` that may name files: all its literal arguments, less the
/// pattern of a pattern-first command and the operands of a text-only one.
fn path_operands(command: &AnalyzedCommand) -> impl Iterator<Item = &String> {
    let name = command.name.as_deref().unwrap_or_default();
    let name = name.rsplit('/').next().unwrap_or(name);
    let text_only = TEXT_ONLY.contains(&name);
    let mut pattern_pending = PATTERN_FIRST.contains(&name);
    let mut value_next = false;
    command.args.iter().flatten().filter(move |word| {
        if text_only {
            return false;
        }
        if std::mem::take(&mut value_next) {
            return false;
        }
        if word.starts_with('-') {
            if PATTERN_OPTIONS.contains(&word.as_str()) {
                pattern_pending = false;
                value_next = true;
            } else if VALUE_OPTIONS.contains(&word.as_str()) {
                value_next = true;
            }
            return false;
        }
        !std::mem::take(&mut pattern_pending)
    })
}

fn check_paths<'a>(words: impl Iterator<Item = &'a String>) -> Result<(), String> {
    for word in words {
        if !word.starts_with('/') {
            continue;
        }
        let inside = PATHS_OF_THE_SHELL.iter().any(|root| {
            word == root
                || word
                    .strip_prefix(root)
                    .is_some_and(|rest| rest.starts_with('/'))
        });
        if !inside {
            return Err(format!("the script names {word}, outside the workspace"));
        }
    }
    Ok(())
}

fn one_line(err: &bashkit::Error) -> String {
    err.to_string()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn implemented() -> BTreeSet<String> {
        [
            "cat", "grep", "sort", "find", "wc", "xargs", "echo", "timeout", "env", "curl", "ls",
            "sed", "command",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    fn route(script: &str) -> Result<(), String> {
        shell_can_run(script, &implemented(), &ShellPolicy::default()).map_err(|u| u.to_string())
    }

    #[test]
    fn plain_pipelines_of_implemented_commands_are_the_shells() {
        assert_eq!(route("cat a.txt | grep -i todo | sort > /tmp/x"), Ok(()));
        assert_eq!(route("f() { echo hi; }; f | wc -l"), Ok(()));
        assert_eq!(route("find . -name '*.rs' -exec wc -l {} +"), Ok(()));
        assert_eq!(
            route("xargs -d '\\n' -n1 echo; command -v gcc || echo no"),
            Ok(())
        );
        assert_eq!(route("cat /workspace/a /dev/null"), Ok(()));
        assert_eq!(route("grep '/api/' a.txt | sed '/x/d' | echo /etc"), Ok(()));
    }

    #[test]
    fn what_the_shell_cannot_run_says_why() {
        let git = route("git status && cat a").unwrap_err();
        assert_eq!(git, "`git` is not a command the shell implements");
        assert!(route("ls | xargs git add").unwrap_err().contains("`git`"));
        assert!(route("xargs -d , -n 1 git add")
            .unwrap_err()
            .contains("`git`"));
        assert!(route("env -u X npm t").unwrap_err().contains("`npm`"));
        assert!(route("./build.sh").unwrap_err().contains("./build.sh"));
        assert!(route("timeout 5 python3 x.py")
            .unwrap_err()
            .contains("`python3`"));
        assert!(route("env A=1 npm test").unwrap_err().contains("`npm`"));
        assert!(route("find . -exec rm {} \\;")
            .unwrap_err()
            .contains("`rm`"));
        assert!(route("curl example.com").unwrap_err().contains("policy"));
        assert!(route("eval \"$x\"").unwrap_err().contains("interpreter"));
        assert!(route("$cmd a").unwrap_err().contains("run time"));
        assert!(route("cat /etc/passwd")
            .unwrap_err()
            .contains("/etc/passwd"));
        assert!(route("echo x > /workspace2/y")
            .unwrap_err()
            .contains("/workspace2"));
        assert!(route("echo 'unterminated").unwrap_err().contains("parse"));
    }

    #[test]
    fn the_same_script_always_routes_the_same_way() {
        for _ in 0..3 {
            assert_eq!(route("cat a | sort"), Ok(()));
            assert!(route("git log").is_err());
        }
    }
}
