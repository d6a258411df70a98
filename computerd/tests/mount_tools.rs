//! Real tools working in a mounted workspace: git, tar, cargo, npm.

mod common;

use common::{assert_same_manifest, manifest, sh, Mount};

/// `git init`, commits of 100 files and a subdirectory, log, status, gc, fsck; the same
/// after a remount; then the database passes `check`.
#[test]
fn git_repository_in_mount() {
    let mut m = Mount::new();
    m.sh(r#"
git init -q -b main repo
cd repo
for i in $(seq 1 100); do printf 'file %d\n%s\n' "$i" "$(seq 1 "$i")" > "f$i.txt"; done
mkdir -p sub/deeper
echo a > sub/a.txt
echo b > sub/deeper/b.txt
printf '#!/bin/sh\necho run\n' > sub/run.sh
chmod +x sub/run.sh
ln -s sub/a.txt link
git add -A
git commit -q -m "first: 100 files and a subdirectory"
test -z "$(git status --porcelain)"
# A second commit: modify, rename, delete, add.
for i in $(seq 1 10); do echo changed >> "f$i.txt"; done
git mv f50.txt sub/deeper/f50-moved.txt
git rm -q f99.txt
echo new > sub/new.txt
git add -A
git commit -q -m "second: modify, rename, delete"
"#);
    let log = m.sh("git -C repo log --format=%s");
    assert_eq!(
        log,
        "second: modify, rename, delete\nfirst: 100 files and a subdirectory\n"
    );
    assert_eq!(m.sh("git -C repo status --porcelain"), "");
    assert_eq!(
        m.sh("git -C repo ls-files | wc -l").trim(),
        "104",
        "tracked files"
    );
    // Branches, checkout, stash, rebase, worktree, tag: lock files, renames, rewrites.
    m.sh(r#"
cd repo
git checkout -q -b topic
echo topic >> f1.txt && git commit -q -am "topic change"
git checkout -q main
echo main >> f2.txt && git commit -q -am "main change"
echo dirty >> f3.txt
git stash -q
test -z "$(git status --porcelain)"
git stash pop -q
git checkout -q -- f3.txt
git checkout -q topic
git rebase -q main
test "$(git log --format=%s -1)" = "topic change"
git checkout -q main
git merge -q --ff-only topic
git worktree add -q ../wt -b wt-branch
test -f ../wt/f1.txt
git worktree remove ../wt
git branch -q -D topic wt-branch
git tag -a v1 -m "version 1"
"#);
    assert_eq!(
        m.sh("git -C repo log --format=%s"),
        "topic change\nmain change\nsecond: modify, rename, delete\nfirst: 100 files and a subdirectory\n"
    );
    m.sh("cd repo && git -c gc.autoDetach=false gc -q && git fsck --full --strict");
    assert_eq!(m.sh("git -C repo status --porcelain"), "");
    assert_eq!(
        m.sh("git -C repo count-objects -v | grep '^count:'"),
        "count: 0\n"
    );
    let head = m.sh("git -C repo rev-parse HEAD");

    m.unmount();
    m.mount(&[]);
    m.sh("cd repo && git fsck --full --strict && test -z \"$(git status --porcelain)\"");
    assert_eq!(m.sh("git -C repo rev-parse HEAD"), head);
    assert_eq!(
        m.sh("cat repo/sub/deeper/f50-moved.txt | head -1"),
        "file 50\n"
    );
    assert_eq!(m.sh("repo/sub/run.sh"), "run\n");
    m.unmount();
    m.check_db();
}

/// `git clone file://<repo outside the mount>` into the mount; log, status and fsck.
#[test]
fn git_clone_into_mount() {
    let mut m = Mount::new();
    let origin = m.scratch.join("origin");
    sh(
        &m.scratch,
        r#"
git init -q -b main origin
cd origin
for c in $(seq 1 5); do
  mkdir -p "dir$c/nested"
  for i in $(seq 1 20); do echo "commit $c file $i" > "dir$c/nested/file$i"; done
  head -c 200000 /dev/urandom > "dir$c/blob.bin"
  git add -A
  git commit -q -m "commit $c"
done
printf '#!/bin/sh\necho hi\n' > tool.sh && chmod 755 tool.sh && ln -s tool.sh tool-link
git add -A && git commit -q -m "commit 6: executable and symlink"
"#,
    );
    m.sh(&format!("git clone -q file://{} clone", origin.display()));
    assert_eq!(m.sh("git -C clone log --oneline | wc -l").trim(), "6");
    assert_eq!(m.sh("git -C clone status --porcelain"), "");
    m.sh("git -C clone fsck --full --strict");
    assert_eq!(
        m.sh("git -C clone rev-parse HEAD"),
        sh(&origin, "git rev-parse HEAD")
    );
    assert_eq!(
        m.sh("git -C clone ls-files -s"),
        sh(&origin, "git ls-files -s"),
        "index of the clone"
    );
    assert_eq!(m.sh("clone/tool-link"), "hi\n");
    // The work tree is byte-identical to the origin's.
    let strip_git = |text: String| -> String {
        text.lines()
            .filter(|l| !l.starts_with(".git"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_same_manifest(
        "clone work tree",
        &strip_git(manifest(&origin, false)),
        &strip_git(manifest(&m.path("clone"), false)),
    );
    m.unmount();
    m.check_db();
}

/// Builds the tar test tree in `dir`: files, nested directories, relative, absolute and
/// dangling symlinks, hard links, odd permissions and owners, fixed times.
const MAKE_TREE: &str = r#"
mkdir -p src/a/b/c src/empty-dir src/sticky "src/sp ace/é"
cd src
printf 'hello\n' > a/hello.txt
head -c 300000 /dev/urandom > a/b/random.bin
head -c 3000000 /dev/urandom > a/b/c/big.bin
: > a/empty.txt
seq 1 20000 > "sp ace/é/numbers.txt"
printf 'long\n' > "$(printf 'n%.0s' $(seq 1 250)).txt"
ln -s hello.txt a/rel-link
ln -s ../random.bin a/b/c/up-link
ln -s /etc/hostname abs-link
ln -s does/not/exist dangling
ln -s a dir-link
ln a/hello.txt a/b/hard1
ln a/hello.txt hard2
ln a/b/random.bin a/b/c/hard-random
printf '#!/bin/sh\n' > setuid && chmod 4755 setuid
printf 'g\n' > setgid && chmod 2750 setgid
printf 'n\n' > nothing && chmod 0000 nothing
printf 'o\n' > owned && chown 1234:5678 owned
chmod 0600 a/b/random.bin
chmod 0444 a/hello.txt
chmod 0751 a/b
chmod 0700 a/b/c
chmod 1777 sticky
chmod 0555 empty-dir
chown -h 4321:8765 a/rel-link
touch -d '2001-02-03 04:05:06' a/empty.txt owned
touch -h -d '2002-03-04 05:06:07' a/rel-link
find . -type d -exec touch -d '2003-04-05 06:07:08' {} +
"#;

/// A tree tarred outside the mount, extracted inside with `tar xpf`, compared (content,
/// modes, owners, times, symlinks, hard links), then tarred from inside back out.
#[test]
fn tar_round_trip() {
    let mut m = Mount::new();
    sh(&m.scratch, MAKE_TREE);
    let src = m.scratch.join("src");
    let expected = manifest(&src, true);
    sh(&m.scratch, "tar cf src.tar -C src .");

    m.sh(&format!(
        "mkdir x && tar xpf {}/src.tar -C x",
        m.scratch.display()
    ));
    assert_same_manifest(
        "extracted in the mount",
        &expected,
        &manifest(&m.path("x"), true),
    );
    // tar's own comparison: modes, owners, times, sizes, contents, link targets.
    m.sh(&format!(
        "tar --compare -f {}/src.tar -C x",
        m.scratch.display()
    ));
    // Hard links share an inode number inside the mount, and only they do.
    m.sh(r#"
cd x
i=$(stat -c %i a/hello.txt)
test "$(stat -c %i a/b/hard1)" = "$i" && test "$(stat -c %i hard2)" = "$i"
test "$(stat -c %h a/hello.txt)" = 3
test "$(stat -c %i a/b/c/hard-random)" = "$(stat -c %i a/b/random.bin)"
test "$(stat -c %i a/b/random.bin)" != "$i"
test "$(readlink a/b/c/up-link)" = ../random.bin
test "$(readlink abs-link)" = /etc/hostname
test "$(readlink dangling)" = does/not/exist
cmp a/b/c/up-link a/b/random.bin
"#);

    // From the mount back out.
    m.sh(&format!(
        "tar cf {s}/back.tar -C x . && mkdir {s}/back && tar xpf {s}/back.tar -C {s}/back",
        s = m.scratch.display()
    ));
    assert_same_manifest(
        "tarred from the mount and extracted outside",
        &expected,
        &manifest(&m.scratch.join("back"), true),
    );

    m.unmount();
    m.mount(&[]);
    assert_same_manifest(
        "extracted in the mount, after a remount",
        &expected,
        &manifest(&m.path("x"), true),
    );
    m.sh(&format!(
        "tar --compare -f {}/src.tar -C x",
        m.scratch.display()
    ));
    m.unmount();
    m.check_db();
}

/// A crate without dependencies created and built inside the mount (target dir inside
/// too); the binary runs; a rebuild without changes does nothing; a change rebuilds.
#[test]
fn cargo_build_in_mount() {
    let mut m = Mount::new();
    let target = m.path("target");
    let env = format!("export CARGO_TARGET_DIR={}; ", target.display());
    m.sh(&format!(
        "{env}cargo new --offline --vcs none --name hello hello 2>&1"
    ));
    std::fs::write(
        m.path("hello/src/main.rs"),
        r#"mod greet;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    println!("{}", greet::greet(&args));
}
"#,
    )
    .unwrap();
    std::fs::write(
        m.path("hello/src/greet.rs"),
        r#"pub fn greet(names: &[String]) -> String {
    let total: u64 = (1..=100u64).sum();
    format!("hello {} ({total})", names.join(", "))
}

#[cfg(test)]
mod tests {
    #[test]
    fn greets() {
        assert_eq!(super::greet(&["a".into()]), "hello a (5050)");
    }
}
"#,
    )
    .unwrap();
    m.sh(&format!(
        "{env}cd hello && cargo build --offline 2>&1 && cargo test --offline -q 2>&1"
    ));
    assert_eq!(
        m.sh("target/debug/hello mount fuse"),
        "hello mount, fuse (5050)\n"
    );
    let again = m.sh(&format!("{env}cd hello && cargo build --offline -v 2>&1"));
    assert!(
        again.contains("Fresh hello"),
        "a rebuild without changes recompiled:\n{again}"
    );
    m.sh(&format!(
        "{env}cd hello && sed -i 's/hello {{}}/howdy {{}}/' src/greet.rs && cargo build --offline 2>&1"
    ));
    assert_eq!(m.sh("target/debug/hello x"), "howdy x (5050)\n");
    m.unmount();
    m.check_db();
}

/// `npm install --offline` of a packed local package into a project in the mount.
#[test]
fn npm_install_offline_in_mount() {
    let mut m = Mount::new();
    let pkg = m.scratch.join("greeter");
    std::fs::create_dir(&pkg).unwrap();
    std::fs::write(
        pkg.join("package.json"),
        r#"{"name": "greeter", "version": "1.2.3", "main": "index.js", "license": "MIT"}"#,
    )
    .unwrap();
    std::fs::write(
        pkg.join("index.js"),
        "const path = require('path');\nmodule.exports = (n) => `hello ${n} from ${path.basename(__dirname)}`;\n",
    )
    .unwrap();
    let cache = m.scratch.join("npm-cache");
    let env = format!("export npm_config_cache={}; ", cache.display());
    let tgz = sh(&pkg, &format!("{env}npm pack --silent"));
    let tgz = pkg.join(tgz.trim());
    assert!(tgz.exists(), "npm pack made no {}", tgz.display());

    m.sh(&format!(
        "{env}mkdir app && cd app && npm init -y >/dev/null && \
         npm install --offline --no-audit --no-fund {} 2>&1",
        tgz.display()
    ));
    let out = m.sh("cd app && node -e 'console.log(require(\"greeter\")(\"mount\"))'");
    assert_eq!(out, "hello mount from greeter\n");
    let dep = m.sh("cd app && node -p 'require(\"./package.json\").dependencies.greeter'");
    assert!(dep.contains("greeter-1.2.3.tgz"), "dependency entry: {dep}");
    m.sh("cd app && test -f package-lock.json && test -f node_modules/greeter/package.json");
    m.sh(&format!("{env}cd app && npm ls greeter 2>&1"));

    m.unmount();
    m.mount(&[]);
    let out = m.sh("cd app && node -e 'console.log(require(\"greeter\")(\"again\"))'");
    assert_eq!(out, "hello again from greeter\n");
    m.unmount();
    m.check_db();
}

/// A C project built with make: a second make does nothing, a touched source rebuilds
/// only what depends on it; the same after a remount.
#[test]
fn make_c_project_in_mount() {
    let mut m = Mount::new();
    m.sh("mkdir proj");
    let write = |name: &str, text: &str| std::fs::write(m.path("proj").join(name), text).unwrap();
    write(
        "Makefile",
        "CFLAGS = -O1 -Wall\nprog: main.o util.o\n\t$(CC) -o $@ $^\n%.o: %.c util.h\n\t$(CC) $(CFLAGS) -c -o $@ $<\n",
    );
    write("util.h", "int add(int a, int b);\n");
    write(
        "util.c",
        "#include \"util.h\"\nint add(int a, int b) { return a + b; }\n",
    );
    write(
        "main.c",
        "#include <stdio.h>\n#include \"util.h\"\nint main(void) { printf(\"%d\\n\", add(40, 2)); return 0; }\n",
    );
    m.sh("make -s -C proj");
    assert_eq!(m.sh("proj/prog"), "42\n");
    let again = m.sh("make -C proj 2>&1");
    assert!(again.contains("is up to date"), "second make:\n{again}");
    m.sh("sleep 0.01 && touch proj/util.c");
    let rebuilt = m.sh("make -C proj 2>&1");
    assert!(
        rebuilt.contains("-c -o util.o") && !rebuilt.contains("-c -o main.o"),
        "make after touching util.c:\n{rebuilt}"
    );
    m.unmount();
    m.mount(&[]);
    let after = m.sh("make -C proj 2>&1");
    assert!(
        after.contains("is up to date"),
        "make after a remount:\n{after}"
    );
    assert_eq!(m.sh("proj/prog"), "42\n");
    m.unmount();
    m.check_db();
}
