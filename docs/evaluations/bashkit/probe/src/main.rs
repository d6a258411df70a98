use bashkit::{
    Bash, DirEntry, ExecOptions, ExecutionLimits, FileSystem, FileSystemExt, InMemoryFs, Metadata,
    Result, async_trait,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

// ---------- logging wrapper FS (proves pluggability, shows call pattern) ----------
struct LogFs {
    inner: Arc<dyn FileSystem>,
    log: Arc<Mutex<Vec<String>>>,
}
impl LogFs {
    fn rec(&self, s: String) {
        self.log.lock().unwrap().push(s);
    }
}
#[async_trait]
impl FileSystemExt for LogFs {}
#[async_trait]
impl FileSystem for LogFs {
    async fn read_file(&self, p: &Path) -> Result<Vec<u8>> {
        self.rec(format!("read_file {}", p.display()));
        self.inner.read_file(p).await
    }
    async fn write_file(&self, p: &Path, c: &[u8]) -> Result<()> {
        self.rec(format!("write_file {} ({} bytes)", p.display(), c.len()));
        self.inner.write_file(p, c).await
    }
    async fn append_file(&self, p: &Path, c: &[u8]) -> Result<()> {
        self.rec(format!("append_file {} ({} bytes)", p.display(), c.len()));
        self.inner.append_file(p, c).await
    }
    async fn mkdir(&self, p: &Path, r: bool) -> Result<()> {
        self.rec(format!("mkdir {} rec={r}", p.display()));
        self.inner.mkdir(p, r).await
    }
    async fn remove(&self, p: &Path, r: bool) -> Result<()> {
        self.rec(format!("remove {} rec={r}", p.display()));
        self.inner.remove(p, r).await
    }
    async fn stat(&self, p: &Path) -> Result<Metadata> {
        self.rec(format!("stat {}", p.display()));
        self.inner.stat(p).await
    }
    async fn lstat(&self, p: &Path) -> Result<Metadata> {
        self.rec(format!("lstat {}", p.display()));
        self.inner.lstat(p).await
    }
    async fn read_dir(&self, p: &Path) -> Result<Vec<DirEntry>> {
        self.rec(format!("read_dir {}", p.display()));
        self.inner.read_dir(p).await
    }
    async fn exists(&self, p: &Path) -> Result<bool> {
        self.rec(format!("exists {}", p.display()));
        self.inner.exists(p).await
    }
    async fn rename(&self, a: &Path, b: &Path) -> Result<()> {
        self.rec(format!("rename {} -> {}", a.display(), b.display()));
        self.inner.rename(a, b).await
    }
    async fn copy(&self, a: &Path, b: &Path) -> Result<()> {
        self.rec(format!("copy {} -> {}", a.display(), b.display()));
        self.inner.copy(a, b).await
    }
    async fn symlink(&self, t: &Path, l: &Path) -> Result<()> {
        self.rec(format!("symlink {} -> {}", l.display(), t.display()));
        self.inner.symlink(t, l).await
    }
    async fn read_link(&self, p: &Path) -> Result<PathBuf> {
        self.rec(format!("read_link {}", p.display()));
        self.inner.read_link(p).await
    }
    async fn chmod(&self, p: &Path, m: u32) -> Result<()> {
        self.rec(format!("chmod {} {:o}", p.display(), m));
        self.inner.chmod(p, m).await
    }
    async fn set_modified_time(&self, p: &Path, t: SystemTime) -> Result<()> {
        self.rec(format!("set_modified_time {}", p.display()));
        self.inner.set_modified_time(p, t).await
    }
}

async fn make_fs(fixtures: &serde_json::Map<String, serde_json::Value>) -> Arc<dyn FileSystem> {
    let fs: Arc<dyn FileSystem> = Arc::new(InMemoryFs::new());
    fs.mkdir(Path::new("/work"), true).await.unwrap();
    for (k, v) in fixtures {
        let p = Path::new("/work").join(k);
        fs.mkdir(p.parent().unwrap(), true).await.unwrap();
        fs.write_file(&p, v.as_str().unwrap().as_bytes()).await.unwrap();
    }
    fs
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(|s| s.as_str()) {
        Some("builtins") => {
            let b = Bash::new();
            let mut n = b.builtin_names();
            n.sort();
            println!("{}", n.join("\n"));
        }
        Some("run") => {
            // stdin: {"fixtures":{...}, "scripts":[{"name":..,"src":..}]}
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).unwrap();
            let v: serde_json::Value = serde_json::from_str(&s).unwrap();
            let fixtures = v["fixtures"].as_object().unwrap();
            let mut out = vec![];
            for sc in v["scripts"].as_array().unwrap() {
                let fs = make_fs(fixtures).await;
                let mut bash = Bash::builder().fs(fs).cwd("/work").build();
                let t0 = Instant::now();
                let r = tokio::time::timeout(
                    Duration::from_secs(20),
                    bash.exec(sc["src"].as_str().unwrap()),
                )
                .await;
                let el = t0.elapsed().as_millis();
                let j = match r {
                    Err(_) => serde_json::json!({"name": sc["name"], "error": "host timeout", "ms": el}),
                    Ok(Err(e)) => serde_json::json!({"name": sc["name"], "error": e.to_string(), "ms": el}),
                    Ok(Ok(r)) => serde_json::json!({"name": sc["name"],
                        "stdout": r.stdout.to_string(), "stderr": r.stderr.to_string(),
                        "exit": r.exit_code, "ms": el}),
                };
                out.push(j);
            }
            println!("{}", serde_json::to_string_pretty(&out).unwrap());
        }
        Some("stream") => {
            let t0 = Instant::now();
            let log: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(vec![]));
            let l2 = log.clone();
            let mut bash = Bash::new();
            let script = "echo start; sleep 0.3; echo mid >&2; for i in 1 2 3; do echo it$i; sleep 0.2; done; echo end";
            let r = bash
                .exec_with_options(
                    script,
                    ExecOptions::new().streaming(Box::new(move |o, e| {
                        l2.lock().unwrap().push(format!(
                            "{:>5}ms stdout={:?} stderr={:?}",
                            t0.elapsed().as_millis(),
                            o.to_string(),
                            e.to_string()
                        ));
                    })),
                )
                .await
                .unwrap();
            for l in log.lock().unwrap().iter() {
                println!("{l}");
            }
            println!("final at {}ms exit={} stdout={:?}", t0.elapsed().as_millis(), r.exit_code, r.stdout.to_string());
        }
        Some("cancel") => {
            let bash = Bash::builder()
                .limits(ExecutionLimits::new().max_loop_iterations(usize::MAX).max_total_loop_iterations(usize::MAX).max_commands(usize::MAX).timeout(Duration::from_secs(60)))
                .build();
            let tok = bash.cancellation_token();
            let t0 = Instant::now();
            let h = tokio::spawn(async move {
                let mut bash = bash;
                let r = bash.exec("i=0; while true; do i=$((i+1)); done").await;
                (r.map(|r| r.exit_code), t0.elapsed())
            });
            tokio::time::sleep(Duration::from_millis(500)).await;
            let t1 = Instant::now();
            std::thread::spawn(move || tok.store(true, std::sync::atomic::Ordering::SeqCst)).join().unwrap();
            let (r, el) = h.await.unwrap();
            println!("cancel: result={:?} total={:?} latency_after_flag={:?}", r.map_err(|e| format!("{e:?}")), el, t1.elapsed());
            // cancel during sleep
            let bash = Bash::new();
            let tok = bash.cancellation_token();
            let t0 = Instant::now();
            let h = tokio::spawn(async move { let mut bash = bash; bash.exec("sleep 5; echo done").await.map(|r| r.exit_code) });
            tokio::time::sleep(Duration::from_millis(300)).await;
            tok.store(true, std::sync::atomic::Ordering::SeqCst);
            let r = h.await.unwrap();
            println!("cancel during sleep 5: result={:?} after {:?}", r.map_err(|e| format!("{e}")), t0.elapsed());
            // dropping the future (tokio timeout) as alternative cancellation
            let mut bash = Bash::new();
            let t0 = Instant::now();
            let r = tokio::time::timeout(Duration::from_millis(300), bash.exec("sleep 5; echo done")).await;
            println!("tokio::time::timeout drop of sleep 5: timed_out={} after {:?}", r.is_err(), t0.elapsed());
        }
        Some("limits") => {
            let cases: Vec<(&str, ExecutionLimits, &str)> = vec![
                ("default: 20k-iteration loop", ExecutionLimits::default(), "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo $i"),
                ("default: 15k commands", ExecutionLimits::default(), "for i in $(seq 1 3); do :; done; c=0; while [ $c -lt 9000 ]; do c=$((c+1)); done; echo $c"),
                ("default: recursion depth 20", ExecutionLimits::default(), "f(){ if [ $1 -gt 0 ]; then f $(( $1 - 1 )); else echo bottom; fi; }; f 20"),
                ("max_function_depth(100): recursion 50", ExecutionLimits::new().max_function_depth(100), "f(){ if [ $1 -gt 0 ]; then f $(( $1 - 1 )); else echo bottom; fi; }; f 50"),
                ("default: 2MB stdout", ExecutionLimits::default(), "head -c 2000000 /dev/zero | tr '\\0' a; echo"),
                ("timeout 1s: sleep 3", ExecutionLimits::new().timeout(Duration::from_secs(1)), "echo a; sleep 3; echo b"),
                ("timeout 1s: busy loop", ExecutionLimits::new().timeout(Duration::from_secs(1)).max_loop_iterations(usize::MAX).max_total_loop_iterations(usize::MAX).max_commands(usize::MAX), "while true; do :; done"),
                ("max_commands(5)", ExecutionLimits::new().max_commands(5), "echo 1; echo 2; echo 3; echo 4; echo 5; echo 6; echo 7"),
            ];
            for (name, lim, script) in cases {
                let mut bash = Bash::builder().limits(lim).build();
                let t0 = Instant::now();
                let r = bash.exec(script).await;
                match r {
                    Ok(r) => println!("[{name}] Ok exit={} stdout_len={} stdout_tail={:?} trunc={} stderr={:?} ({:?})", r.exit_code, r.stdout.to_string().len(), r.stdout.to_string().chars().rev().take(30).collect::<String>().chars().rev().collect::<String>(), r.stdout_truncated, r.stderr.to_string().chars().take(200).collect::<String>(), t0.elapsed()),
                    Err(e) => println!("[{name}] Err {e} ({:?})", t0.elapsed()),
                }
            }
            // session limit on exec calls
            let mut bash = Bash::new();
            let mut fails = None;
            for i in 0..1100 {
                if let Err(e) = bash.exec("true").await { fails = Some((i, e.to_string())); break; }
            }
            println!("[default session: 1100 exec() calls on one Bash] first failure: {:?}", fails);
        }
        Some("customfs") => {
            let log = Arc::new(Mutex::new(vec![]));
            let inner: Arc<dyn FileSystem> = Arc::new(InMemoryFs::new());
            inner.mkdir(Path::new("/work"), true).await.unwrap();
            inner.write_file(Path::new("/work/a.txt"), b"hello\nworld\n").await.unwrap();
            let fs = Arc::new(LogFs { inner, log: log.clone() });
            let mut bash = Bash::builder().fs(fs).cwd("/work").build();
            for script in [
                "cat a.txt",
                "echo x >> a.txt",
                "echo y > b.txt",
                "sed -i s/hello/HELLO/ a.txt",
                "ls",
                "mv b.txt c.txt",
                "touch d.txt",
                "chmod 755 d.txt",
                "ln -s a.txt l.txt; cat l.txt",
                "stat -c '%s %a %Y' a.txt",
                "ls -l a.txt",
                "truncate -s 2 a.txt; cat a.txt",
                "find . -name '*.txt'",
                "grep -r HE .",
            ] {
                log.lock().unwrap().clear();
                let r = bash.exec(script).await;
                let (o, c) = match &r { Ok(r) => (r.stdout.to_string() + &r.stderr.to_string(), r.exit_code), Err(e) => (e.to_string(), -1) };
                println!("$ {script}   -> exit {c}, out {:?}", o);
                for l in log.lock().unwrap().iter() { println!("    fs: {l}"); }
            }
        }
        Some("analyze") => {
            let bash = Bash::new();
            for s in [
                "cat notes.txt | grep -i todo | sort | uniq -c",
                "find . -name '*.rs' -exec wc -l {} \\; | xargs echo",
                "f(){ rm -rf /; }; x=$(date); for i in 1 2; do $cmd --x; done; eval 'ls'",
                "if [[ -f a ]]; then sed -i s/a/b/ a > out.txt 2>&1; fi",
                "echo 'unterminated",
                "git status && python3 -c 'print(1)' | jq .",
            ] {
                match bash.analyze(s) {
                    Ok(a) => println!("{s}\n  names={:?} opaque={} wrappers={:?} subst={} reentry={} functions={:?} redirects={:?}", a.command_names(), a.is_opaque(), a.command_wrappers(), a.has_command_substitution, a.has_interpreter_reentry, a.functions, a.redirects),
                    Err(e) => println!("{s}\n  ERR {e}"),
                }
            }
            // raw parser AST
            let ast = bashkit::parser::Parser::new("a | b && c > f").parse().unwrap();
            let dbg = format!("{:?}", ast);
            println!("raw AST debug (first 400 chars): {}", &dbg[..dbg.len().min(400)]);
        }
        _ => eprintln!("usage: probe builtins|run|stream|cancel|limits|customfs|analyze"),
    }
}
