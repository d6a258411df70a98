//! The `shell` backend: a bash-compatible interpreter (bashkit, pinned) running inside
//! the daemon on the workspace store itself, with no OS process.
//!
//! The shell's namespace is bashkit's own: the workspace at `/workspace`
//! ([`store_fs::StoreFs`] over the store's path API), a scratch `/tmp` in memory shared
//! by the connection's execs (as the Linux backend's warm sandbox shares its `/tmp`),
//! and bashkit's synthetic `/etc`, `/proc`, `/dev/null` and command stubs; nothing of
//! the host. Writes are store mutations, visible to every other backend and replica
//! when each returns, so the bracket has nothing to sync: the result is always
//! `Complete`.

mod policy;
mod route;
mod run;
mod sleep;
mod store_fs;
mod zcat;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bashkit::{Bash, ExecutionLimits, FileSystem, InMemoryFs, SessionLimits};
use computer_vfs::Workspace;

use crate::backend::{Backend, Connection, Description, SpawnRequest, Spawned};
use crate::error::{Error, Result};
use crate::exec::SyncOutcome;
use crate::linux::{BASE_ENV, SANDBOX_WORKSPACE};

pub(crate) use policy::PathRules;
pub use policy::{
    ShellLimits, ShellPolicy, COMMANDS_NEVER, FUNCTION_DEPTH_MAX, LOOP_ITERATIONS_TOTAL_PER_LOOP,
};
pub use run::EXIT_LIMIT;
pub use store_fs::ChangeObserver;

/// The backend's id.
pub const SHELL_BACKEND_ID: &str = "shell";
/// Wall time of an exec whose policy and caller set none (bashkit needs one).
const TIMEOUT_DEFAULT: Duration = Duration::from_secs(24 * 3600);

/// The shell backend over one workspace.
pub struct ShellBackend {
    shared: Arc<Shared>,
}

struct Shared {
    ws: Workspace,
    policy: ShellPolicy,
    rules: Arc<policy::PathRules>,
    /// The commands bashkit implements (before the policy's choice).
    implemented: BTreeSet<String>,
    changed: Option<ChangeObserver>,
}

impl ShellBackend {
    /// `changed` is told the paths each mutation changed (a mount's kernel cache).
    pub fn new(
        ws: Workspace,
        policy: ShellPolicy,
        changed: Option<ChangeObserver>,
    ) -> Result<ShellBackend> {
        let rules = Arc::new(policy.path_rules().map_err(Error::Invalid)?);
        let implemented = with_our_commands(Bash::builder())
            .build()
            .builtin_names()
            .into_iter()
            .collect();
        Ok(ShellBackend {
            shared: Arc::new(Shared {
                ws,
                policy,
                rules,
                implemented,
                changed,
            }),
        })
    }

    /// The commands the shell runs under its policy, sorted.
    pub fn commands(&self) -> Vec<String> {
        let shared = &self.shared;
        (shared.implemented.iter())
            .filter(|name| shared.policy.allows(name))
            .cloned()
            .collect()
    }
}

impl Backend for ShellBackend {
    fn id(&self) -> &str {
        SHELL_BACKEND_ID
    }

    fn describe(&self) -> Description {
        Description {
            id: SHELL_BACKEND_ID.into(),
            summary: "a bash-compatible shell inside the daemon, on the workspace store, \
                      no OS process"
                .into(),
            runs: format!(
                "bash scripts of {} commands it implements (cat, grep, sed, awk, find, jq, \
                 ...); not git, python, npm or other programs",
                self.commands().len()
            ),
            touches: format!("the workspace at {SANDBOX_WORKSPACE}, a /tmp in memory; no network"),
        }
    }

    fn connect(&self) -> Result<Arc<dyn Connection>> {
        Ok(Arc::new(ShellConnection {
            shared: self.shared.clone(),
            tmp: Arc::new(InMemoryFs::new()),
        }))
    }

    fn can_run(&self, script: &str) -> std::result::Result<(), String> {
        let shared = &self.shared;
        route::shell_can_run(script, &shared.implemented, &shared.policy).map_err(|u| u.to_string())
    }
}

struct ShellConnection {
    shared: Arc<Shared>,
    /// The scratch `/tmp` of this connection's execs.
    tmp: Arc<InMemoryFs>,
}

impl ShellConnection {
    fn bash(&self, request: &SpawnRequest) -> Result<Bash> {
        let shared = &self.shared;
        let limits = &shared.policy.limits;
        let execution = ExecutionLimits::new()
            .max_commands(limits.commands_max)
            .max_loop_iterations(limits.loop_iterations_max)
            .max_total_loop_iterations(limits.loop_iterations_total_max)
            .max_stdout_bytes(limits.output_bytes_max)
            .max_stderr_bytes(limits.output_bytes_max)
            .timeout(limits.timeout.unwrap_or(TIMEOUT_DEFAULT));
        let session = SessionLimits {
            max_total_commands: u64::MAX,
            max_exec_calls: u64::MAX,
        };
        let policy = shared.policy.clone();
        let mut builder = with_our_commands(Bash::builder())
            .fs(Arc::new(InMemoryFs::new()))
            .cwd(sandbox_path(&request.cwd))
            .limits(execution)
            .session_limits(session)
            .hostname("computer")
            .builtin_filter(move |name| policy.allows(name));
        builder = builder.env("PWD", sandbox_path(&request.cwd));
        for (name, value) in BASE_ENV {
            builder = builder.env(*name, *value);
        }
        for (name, value) in &request.env {
            builder = builder.env(name, value);
        }
        let bash = builder.build();
        let store = store_fs::StoreFs::new(
            &shared.ws,
            shared.rules.clone(),
            limits,
            shared.changed.clone(),
        );
        let mount = |at: &str, fs: Arc<dyn FileSystem>| {
            bash.mount(at, fs)
                .map_err(|err| Error::Invalid(format!("shell: mounting {at}: {err}")))
        };
        mount(SANDBOX_WORKSPACE, Arc::new(store))?;
        mount("/tmp", self.tmp.clone())?;
        Ok(bash)
    }
}

impl Connection for ShellConnection {
    fn before_exec(&self, _exec_id: &str) -> Result<()> {
        Ok(()) // the shell works on the store itself
    }

    fn spawn(&self, request: &SpawnRequest) -> Result<Spawned> {
        let shared = &self.shared;
        let fit = route::shell_can_run(&request.script, &shared.implemented, &shared.policy);
        if let Err(unfit) = fit {
            if unfit.refuses_explicit_use() {
                return Err(Error::Refused {
                    backend: SHELL_BACKEND_ID.into(),
                    what: format!("{unfit}; run it on linux"),
                });
            }
        }
        let bash = self.bash(request)?;
        run::start(bash, request.script.clone(), &request.exec_id)
    }

    fn after_exec(&self, _exec_id: &str) -> SyncOutcome {
        SyncOutcome::Complete // every write was a store mutation when it returned
    }

    fn timeout_max(&self) -> Option<Duration> {
        self.shared.policy.limits.timeout
    }
}

/// The commands we add to bashkit's, or put in place of its own.
fn with_our_commands(builder: bashkit::BashBuilder) -> bashkit::BashBuilder {
    (builder.builtin("zcat", Box::new(zcat::Zcat))).builtin("sleep", Box::new(sleep::Sleep))
}

/// The working directory `cwd` of the workspace, as the shell names it.
fn sandbox_path(cwd: &str) -> String {
    if cwd == "/" {
        SANDBOX_WORKSPACE.to_owned()
    } else {
        format!("{SANDBOX_WORKSPACE}{cwd}")
    }
}
