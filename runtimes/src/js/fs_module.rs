//! The `fs` module of the js backend: the common subset of Node's `fs/promises` on the
//! store's path API.
//!
//! Native functions (synchronous, each one store call, throwing Node-like errors with
//! `code`, `syscall` and `path`) are handed to the module's JavaScript half
//! ([`FS_MODULE`]) on a global it takes and deletes; that half makes them promises and
//! `Stats` objects. Paths are the shell's: `/workspace/...`, or relative to the working
//! directory; any other absolute path names nothing (ENOENT), and `..` stops at the
//! workspace root.

use std::sync::Arc;

use computer_vfs::{Attr, FileKind, Fs, MkdirOptions, RmOptions, Workspace};
use rquickjs::{Ctx, Exception, Function, Object, TypedArray, Value};

use crate::linux::SANDBOX_WORKSPACE;
use crate::shell::ChangeObserver;

/// The global the native half waits on until the module takes it.
const NATIVE_GLOBAL: &str = "__computer_fs";

/// The module `fs`, served by the loader.
pub(crate) const FS_MODULE: &str = r#"
const native = globalThis.__computer_fs;
delete globalThis.__computer_fs;
class Stats {
  constructor(s) { Object.assign(this, s); this.mtime = new Date(s.mtimeMs); }
  isFile() { return this.kind === 'file'; }
  isDirectory() { return this.kind === 'dir'; }
  isSymbolicLink() { return this.kind === 'symlink'; }
}
const promised = (f) => (...args) => new Promise((resolve, reject) => {
  try { resolve(f(...args)); } catch (e) { reject(e); }
});
const encoding = (o) => typeof o === 'string' ? o : (o && o.encoding) || null;
export const readFile = promised((p, o) => encoding(o) ? native.readText(p) : native.readFile(p));
export const writeFile = promised((p, data) => native.writeFile(p, data));
export const appendFile = promised((p, data) => native.appendFile(p, data));
export const readdir = promised((p) => native.readdir(p));
export const stat = promised((p) => new Stats(native.stat(p)));
export const lstat = promised((p) => new Stats(native.lstat(p)));
export const mkdir = promised((p, o) => native.mkdir(p, !!(o && o.recursive)));
export const rm = promised((p, o) => native.rm(p, !!(o && o.recursive), !!(o && o.force)));
export const rename = promised((a, b) => native.rename(a, b));
export const copyFile = promised((a, b) => native.copyFile(a, b));
export const readlink = promised((p) => native.readlink(p));
export const symlink = promised((t, p) => native.symlink(t, p));
export default { readFile, writeFile, appendFile, readdir, stat, lstat, mkdir, rm, rename,
  copyFile, readlink, symlink };
"#;

/// What the native half works on.
pub(crate) struct FsHost {
    fs: Fs,
    /// The working directory, a workspace path (`/` or `/src`).
    cwd: String,
    changed: Option<ChangeObserver>,
}

/// A failed call: errno and the syscall Node would name.
struct Failed(i32, &'static str);

impl FsHost {
    pub(crate) fn new(ws: &Workspace, cwd: &str, changed: Option<ChangeObserver>) -> FsHost {
        FsHost {
            fs: ws.fs(),
            cwd: cwd.to_owned(),
            changed,
        }
    }

    /// The store path of a path the script names.
    fn store_path(&self, path: &str, syscall: &'static str) -> Result<String, Failed> {
        let joined = match path.strip_prefix(SANDBOX_WORKSPACE) {
            Some("") => "/".to_owned(),
            Some(rest) if rest.starts_with('/') => rest.to_owned(),
            _ if path.starts_with('/') => return Err(Failed(libc::ENOENT, syscall)),
            _ => computer_vfs::join(&self.cwd, path),
        };
        crate::spine::normalize_cwd(&joined).map_err(|_| Failed(libc::ENOENT, syscall))
    }

    /// A module's source, at a store path.
    pub(crate) fn read_module(&self, store_path: &str) -> Result<Vec<u8>, String> {
        self.fs.read_file(store_path).map_err(|err| err.to_string())
    }

    fn changed(&self, paths: &[&str]) {
        if let Some(observer) = &self.changed {
            let paths: Vec<Vec<u8>> = paths.iter().map(|p| p.as_bytes().to_vec()).collect();
            observer(&paths);
        }
    }
}

/// A Node-like error: `ENOENT: no such file or directory, open 'a.txt'`.
fn throw(ctx: &Ctx<'_>, failure: Failed, path: &str) -> rquickjs::Error {
    let Failed(errno, syscall) = failure;
    let code = format!("{:?}", nix::errno::Errno::from_raw(errno));
    let text = nix::errno::Errno::from_raw(errno).desc().to_lowercase();
    let message = format!("{code}: {text}, {syscall} '{path}'");
    let thrown = Exception::from_message(ctx.clone(), &message).and_then(|e| {
        e.set("code", code.as_str())?;
        e.set("errno", -errno)?;
        e.set("syscall", syscall)?;
        e.set("path", path)?;
        Ok(e.into_value())
    });
    match thrown {
        Ok(value) => ctx.throw(value),
        Err(err) => err,
    }
}

/// Bytes of a string or a Uint8Array.
fn bytes_of(ctx: &Ctx<'_>, data: &Value<'_>) -> rquickjs::Result<Vec<u8>> {
    if let Some(text) = data.as_string() {
        return Ok(text.to_string()?.into_bytes());
    }
    if let Ok(array) = TypedArray::<u8>::from_value(data.clone()) {
        // SAFETY: no JavaScript runs while the slice is borrowed; it is copied at once.
        return Ok(unsafe { array.as_bytes() }
            .map(<[u8]>::to_vec)
            .unwrap_or_default());
    }
    Err(Exception::throw_type(
        ctx,
        "data must be a string or a Uint8Array",
    ))
}

fn stats<'js>(ctx: &Ctx<'js>, attr: &Attr) -> rquickjs::Result<Object<'js>> {
    let kind = match attr.kind {
        FileKind::File => "file",
        FileKind::Directory => "dir",
        FileKind::Symlink => "symlink",
        _ => "other",
    };
    let out = Object::new(ctx.clone())?;
    out.set("kind", kind)?;
    out.set("size", attr.size as f64)?;
    out.set("mode", attr.mode())?;
    out.set("mtimeMs", attr.mtime as f64 / 1e6)?;
    Ok(out)
}

/// A store result as the script sees it: the value, or the Node-like error for `path`.
fn done<T>(
    ctx: &Ctx<'_>,
    result: computer_vfs::Result<T>,
    syscall: &'static str,
    path: &str,
) -> rquickjs::Result<T> {
    result.map_err(|err| throw(ctx, Failed(err.errno(), syscall), path))
}

impl FsHost {
    /// The store path of a path the script names, or the error to throw.
    fn at(&self, ctx: &Ctx<'_>, path: &str, syscall: &'static str) -> rquickjs::Result<String> {
        self.store_path(path, syscall)
            .map_err(|f| throw(ctx, f, path))
    }
}

/// Puts the native half where [`FS_MODULE`] takes it.
pub(crate) fn install(ctx: &Ctx<'_>, host: Arc<FsHost>) -> rquickjs::Result<()> {
    let native = Object::new(ctx.clone())?;
    install_reads(ctx, &native, &host)?;
    install_writes(ctx, &native, &host)?;
    install_tree(ctx, &native, &host)?;
    ctx.globals().set(NATIVE_GLOBAL, native)
}

fn install_reads<'js>(
    ctx: &Ctx<'js>,
    native: &Object<'js>,
    host: &Arc<FsHost>,
) -> rquickjs::Result<()> {
    let h = host.clone();
    let read = move |ctx: &Ctx<'js>, path: &str| -> rquickjs::Result<Vec<u8>> {
        done(ctx, h.fs.read_file(&h.at(ctx, path, "open")?), "open", path)
    };
    let read_bytes = read.clone();
    let read_file = move |ctx: Ctx<'js>, path: String| {
        TypedArray::<u8>::new(ctx.clone(), read_bytes(&ctx, &path)?)
    };
    native.set("readFile", Function::new(ctx.clone(), read_file)?)?;
    let read_text = move |ctx: Ctx<'js>, path: String| {
        read(&ctx, &path).map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
    };
    native.set("readText", Function::new(ctx.clone(), read_text)?)?;
    for (name, follow) in [("stat", true), ("lstat", false)] {
        let h = host.clone();
        let stat = move |ctx: Ctx<'js>, path: String| {
            let at = h.at(&ctx, &path, name)?;
            let attr = if follow {
                h.fs.stat(&at)
            } else {
                h.fs.lstat(&at)
            };
            stats(&ctx, &done(&ctx, attr, name, &path)?)
        };
        native.set(name, Function::new(ctx.clone(), stat)?)?;
    }
    let h = host.clone();
    let readdir = move |ctx: Ctx<'js>, path: String| {
        let entries = done(
            &ctx,
            h.fs.readdir(&h.at(&ctx, &path, "scandir")?),
            "scandir",
            &path,
        )?;
        let mut names: Vec<String> = entries.iter().map(|e| e.name_lossy()).collect();
        names.sort();
        Ok::<_, rquickjs::Error>(names)
    };
    native.set("readdir", Function::new(ctx.clone(), readdir)?)?;
    let h = host.clone();
    let readlink = move |ctx: Ctx<'js>, path: String| {
        done(
            &ctx,
            h.fs.readlink(&h.at(&ctx, &path, "readlink")?),
            "readlink",
            &path,
        )
    };
    native.set("readlink", Function::new(ctx.clone(), readlink)?)
}

fn install_writes<'js>(
    ctx: &Ctx<'js>,
    native: &Object<'js>,
    host: &Arc<FsHost>,
) -> rquickjs::Result<()> {
    for (name, append) in [("writeFile", false), ("appendFile", true)] {
        let h = host.clone();
        let write = move |ctx: Ctx<'js>, path: String, data: Value<'js>| {
            let bytes = bytes_of(&ctx, &data)?;
            let at = h.at(&ctx, &path, "open")?;
            let written = if append {
                h.fs.append(&at, &bytes)
            } else {
                h.fs.write_file(&at, &bytes)
            };
            done(&ctx, written, "open", &path)?;
            h.changed(&[&at]);
            Ok::<_, rquickjs::Error>(())
        };
        native.set(name, Function::new(ctx.clone(), write)?)?;
    }
    let h = host.clone();
    let copy_file = move |ctx: Ctx<'js>, from: String, to: String| {
        let (src, dst) = (h.at(&ctx, &from, "copyfile")?, h.at(&ctx, &to, "copyfile")?);
        done(&ctx, h.fs.copy_replacing(&src, &dst), "copyfile", &from)?;
        h.changed(&[&dst]);
        Ok::<_, rquickjs::Error>(())
    };
    native.set("copyFile", Function::new(ctx.clone(), copy_file)?)
}

fn install_tree<'js>(
    ctx: &Ctx<'js>,
    native: &Object<'js>,
    host: &Arc<FsHost>,
) -> rquickjs::Result<()> {
    let h = host.clone();
    let mkdir = move |ctx: Ctx<'js>, path: String, recursive: bool| {
        let at = h.at(&ctx, &path, "mkdir")?;
        let options = MkdirOptions {
            recursive,
            ..MkdirOptions::default()
        };
        done(&ctx, h.fs.mkdir(&at, options), "mkdir", &path)?;
        h.changed(&[&at]);
        Ok::<_, rquickjs::Error>(())
    };
    native.set("mkdir", Function::new(ctx.clone(), mkdir)?)?;
    let h = host.clone();
    let rm = move |ctx: Ctx<'js>, path: String, recursive: bool, force: bool| {
        let at = h.at(&ctx, &path, "rm")?;
        done(
            &ctx,
            h.fs.rm(&at, RmOptions { recursive, force }),
            "rm",
            &path,
        )?;
        h.changed(&[&at]);
        Ok::<_, rquickjs::Error>(())
    };
    native.set("rm", Function::new(ctx.clone(), rm)?)?;
    let h = host.clone();
    let rename = move |ctx: Ctx<'js>, from: String, to: String| {
        let (src, dst) = (h.at(&ctx, &from, "rename")?, h.at(&ctx, &to, "rename")?);
        done(&ctx, h.fs.rename(&src, &dst), "rename", &from)?;
        h.changed(&[&src, &dst]);
        Ok::<_, rquickjs::Error>(())
    };
    native.set("rename", Function::new(ctx.clone(), rename)?)?;
    let h = host.clone();
    let symlink = move |ctx: Ctx<'js>, target: String, path: String| {
        let at = h.at(&ctx, &path, "symlink")?;
        done(&ctx, h.fs.symlink(&target, &at), "symlink", &path)?;
        h.changed(&[&at]);
        Ok::<_, rquickjs::Error>(())
    };
    native.set("symlink", Function::new(ctx.clone(), symlink)?)
}
