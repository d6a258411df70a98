//! Records the commit `computerd` is built from, for `--version` (`unknown` outside a git
//! checkout, `+dirty` when the work tree has uncommitted changes).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn main() {
    let commit = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(commit) => {
            // Without optional locks `git status` leaves the index as it is: in a fresh
            // clone it would rewrite it (its entries are racily clean), and since the
            // index is watched below, the next cargo command would build computerd again
            // (95 s of CI's test step).
            let status = [
                "--no-optional-locks",
                "status",
                "--porcelain",
                "--untracked-files=no",
            ];
            let dirty = git(&status).is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{commit}+dirty")
            } else {
                commit
            }
        }
        None => "unknown".to_owned(),
    };
    println!("cargo:rustc-env=COMPUTERD_COMMIT={commit}");
    // Rebuilt when HEAD moves (a commit, a checkout) or the index changes.
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        for file in ["HEAD", "index"] {
            println!("cargo:rerun-if-changed={git_dir}/{file}");
        }
        if let Some(head_ref) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={git_dir}/{head_ref}");
        }
    }
}
