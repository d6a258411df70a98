//! A deterministic tree shaped like an npm `node_modules`: packages of a few to hundreds
//! of files in nested directories, file sizes log-normal around a few KiB with a long
//! tail, source-like text content, LICENSE files from a few variants, and some packages
//! present twice (a nested `node_modules/<pkg>/node_modules/<dep>` copy of a top-level
//! package, byte for byte, as npm installs one when versions conflict).

use std::collections::HashSet;

/// Seeded SplitMix64: small, fast, and the same on every platform and crate version.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Log-normal with the given median and shape (Box-Muller).
    pub fn log_normal(&mut self, median: f64, sigma: f64) -> f64 {
        let u1 = self.unit().max(f64::MIN_POSITIVE);
        let u2 = self.unit();
        let normal = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        median * (sigma * normal).exp()
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// `n` seeded random bytes (incompressible).
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        out.extend_from_slice(&rng.next_u64().to_le_bytes());
    }
    out.truncate(n);
    out
}

const TOKENS: &[&str] = &[
    "function",
    "return",
    "const",
    "let",
    "var",
    "if",
    "else",
    "for",
    "while",
    "new",
    "this",
    "typeof",
    "undefined",
    "null",
    "true",
    "false",
    "module.exports",
    "require",
    "exports",
    "import",
    "export",
    "default",
    "from",
    "async",
    "await",
    "Promise",
    "Object",
    "Array",
    "String",
    "Error",
    "prototype",
    "length",
    "value",
    "options",
    "callback",
    "err",
    "result",
    "key",
    "name",
    "type",
    "path",
    "data",
    "buffer",
    "node",
    "index",
    "args",
    "opts",
    "parse",
    "resolve",
    "reject",
    "then",
    "emit",
    "push",
    "call",
    "apply",
    "bind",
    "hasOwnProperty",
    "defineProperty",
    "string",
    "number",
    "object",
    "the",
    "a",
    "of",
    "to",
    "is",
    "and",
    "in",
    "@param",
    "@returns",
    "*",
    "//",
    "/**",
    "*/",
    "=",
    "===",
    "!==",
    "=>",
    "&&",
    "||",
    "+",
    "-",
    "?",
    ":",
    ".",
    ",",
    ";",
    "(",
    ")",
    "{",
    "}",
    "[",
    "]",
    "'use strict';",
    "0",
    "1",
];

/// `n` bytes of seeded JavaScript-like text: zstd -1 compresses it about 3x.
pub fn text_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(n + 96);
    let mut column = 0usize;
    while out.len() < n {
        let r = rng.next_u64();
        let word = TOKENS[(r % TOKENS.len() as u64) as usize];
        if (r >> 20).is_multiple_of(19) {
            // An identifier of two tokens.
            out.extend_from_slice(word.as_bytes());
            let other = TOKENS[((r >> 32) % TOKENS.len() as u64) as usize];
            out.extend_from_slice(other.as_bytes());
        } else if (r >> 20).is_multiple_of(23) {
            out.extend_from_slice(((r >> 40) % 10_000).to_string().as_bytes());
        } else {
            out.extend_from_slice(word.as_bytes());
        }
        column += word.len() + 1;
        if column > 72 || (r >> 50).is_multiple_of(9) {
            out.push(b'\n');
            let indent = ((r >> 56) % 4) as usize * 2;
            out.extend(std::iter::repeat_n(b' ', indent));
            column = indent;
        } else {
            out.push(b' ');
        }
    }
    out.truncate(n);
    out
}

/// How one file's content is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Content {
    /// [`text_bytes`] of this length and seed.
    Text { len: usize, seed: u64 },
    /// One of a few LICENSE texts, identical wherever used.
    License(u32),
}

impl Content {
    pub fn bytes(&self) -> Vec<u8> {
        match *self {
            Content::Text { len, seed } => text_bytes(len, seed),
            Content::License(variant) => license(variant),
        }
    }

    pub fn len(&self) -> usize {
        match *self {
            Content::Text { len, .. } => len,
            Content::License(variant) => license(variant).len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn license(variant: u32) -> Vec<u8> {
    let holders = [
        "Sindre Sorhus",
        "TJ Holowaychuk",
        "Jon Schlinkert",
        "Isaac Z. Schlueter",
        "Feross Aboukhadijeh",
        "the contributors",
        "OpenJS Foundation",
        "Mathias Bynens",
    ];
    let year = 2014 + variant % 10;
    let holder = holders[(variant as usize / 10) % holders.len()];
    format!(
        "The MIT License (MIT)\n\nCopyright (c) {year} {holder}\n\n\
         Permission is hereby granted, free of charge, to any person obtaining a copy\n\
         of this software and associated documentation files (the \"Software\"), to deal\n\
         in the Software without restriction, including without limitation the rights\n\
         to use, copy, modify, merge, publish, distribute, sublicense, and/or sell\n\
         copies of the Software, and to permit persons to whom the Software is\n\
         furnished to do so, subject to the following conditions:\n\n\
         The above copyright notice and this permission notice shall be included in\n\
         all copies or substantial portions of the Software.\n\n\
         THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR\n\
         IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,\n\
         FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE\n\
         AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER\n\
         LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,\n\
         OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN\n\
         THE SOFTWARE.\n"
    )
    .into_bytes()
}

/// One step of writing the tree, in the order npm would (package by package).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `mkdir -p`.
    Mkdir(String),
    Write(String, Content),
    /// (target, path)
    Symlink(String, String),
}

/// The shape of the generated tree.
#[derive(Clone, Debug)]
pub struct TreeSpec {
    pub files: usize,
    pub seed: u64,
    /// Median file size, bytes, and the log-normal shape.
    pub median_bytes: f64,
    pub sigma: f64,
    /// Largest file.
    pub max_bytes: usize,
    /// Share of packages that are a nested copy of an earlier one.
    pub duplicate_share: f64,
}

impl TreeSpec {
    pub fn npm(files: usize, seed: u64) -> TreeSpec {
        TreeSpec {
            files,
            seed,
            median_bytes: 2048.0,
            sigma: 1.3,
            max_bytes: 6 << 20,
            duplicate_share: 0.12,
        }
    }
}

/// The generated tree: the ops in order, and counts.
#[derive(Clone, Debug, Default)]
pub struct Tree {
    pub ops: Vec<Op>,
    pub files: usize,
    pub dirs: usize,
    pub symlinks: usize,
    pub bytes: u64,
    /// Files whose content another file of the tree has too.
    pub duplicate_files: usize,
}

impl Tree {
    /// The files, with their content.
    pub fn files(&self) -> impl Iterator<Item = (&str, &Content)> {
        self.ops.iter().filter_map(|op| match op {
            Op::Write(path, content) => Some((path.as_str(), content)),
            _ => None,
        })
    }
}

const SYLLABLES: &[&str] = &[
    "ba", "co", "de", "fi", "go", "hu", "ja", "ke", "lo", "mi", "no", "pa", "qu", "ri", "so", "tu",
    "va", "we", "xo", "yu", "ze", "ar", "el", "is", "on", "ux",
];
const DIRS: &[&str] = &[
    "lib", "dist", "src", "types", "esm", "cjs", "build", "utils", "internal", "helpers", "locale",
    "plugins", "modules", "fp", "es", "umd", "test",
];
const EXTS: &[&str] = &[
    "js", "js", "js", "js", "d.ts", "d.ts", "js.map", "mjs", "cjs", "json", "md", "ts",
];
const SCOPES: &[&str] = &[
    "@babel", "@types", "@jest", "@esbuild", "@eslint", "@smithy",
];

struct Package {
    /// Path of the package directory relative to its `node_modules`.
    name: String,
    /// (relative dir, file name, content), dirs relative to the package directory.
    dirs: Vec<String>,
    files: Vec<(String, Content)>,
}

/// Generates the tree below `root` (e.g. `/node_modules`).
pub fn generate(spec: &TreeSpec, root: &str) -> Tree {
    let mut rng = Rng::new(spec.seed);
    let mut tree = Tree::default();
    let mut packages: Vec<Package> = Vec::new();
    let mut used_names = HashSet::new();
    let mut dirs_made = HashSet::new();
    let mut seeds = 0u64;
    mkdir(&mut tree, &mut dirs_made, root.to_owned());
    while tree.files < spec.files {
        let left = spec.files - tree.files;
        let duplicate = packages.len() > 20 && rng.unit() < spec.duplicate_share;
        let (dir, package) = if duplicate {
            // An earlier package again, byte for byte, nested below another one.
            let original = rng.below(packages.len());
            let host = loop {
                let host = rng.below(packages.len());
                if host != original {
                    break host;
                }
            };
            let dir = format!(
                "{root}/{}/node_modules/{}",
                packages[host].name, packages[original].name
            );
            if !used_names.insert(dir.clone()) {
                continue;
            }
            let copy = Package {
                name: packages[original].name.clone(),
                dirs: packages[original].dirs.clone(),
                files: packages[original].files.clone(),
            };
            (dir, copy)
        } else {
            let package = new_package(&mut rng, spec, &mut seeds, &mut used_names);
            (format!("{root}/{}", package.name), package)
        };
        mkdir(&mut tree, &mut dirs_made, dir.clone());
        for sub in &package.dirs {
            mkdir(&mut tree, &mut dirs_made, format!("{dir}/{sub}"));
        }
        for (rel, content) in package.files.iter().take(left) {
            tree.files += 1;
            tree.bytes += content.len() as u64;
            if duplicate || matches!(content, Content::License(_)) {
                tree.duplicate_files += 1;
            }
            tree.ops.push(Op::Write(format!("{dir}/{rel}"), *content));
        }
        if !duplicate && !package.name.starts_with('@') && rng.unit() < 0.05 {
            let bin = format!("{root}/.bin");
            if !dirs_made.contains(&bin) {
                mkdir(&mut tree, &mut dirs_made, bin.clone());
            }
            tree.ops.push(Op::Symlink(
                format!("../{}/index.js", package.name),
                format!("{bin}/{}", package.name),
            ));
            tree.symlinks += 1;
        }
        if !duplicate {
            packages.push(package);
        }
    }
    tree
}

/// Records `mkdir -p path`, counting each directory once, with its parents.
fn mkdir(tree: &mut Tree, made: &mut HashSet<String>, path: String) {
    let mut at = String::new();
    for part in path.trim_start_matches('/').split('/') {
        at.push('/');
        at.push_str(part);
        if made.insert(at.clone()) {
            tree.dirs += 1;
        }
    }
    tree.ops.push(Op::Mkdir(path));
}

fn new_package(
    rng: &mut Rng,
    spec: &TreeSpec,
    seeds: &mut u64,
    used: &mut HashSet<String>,
) -> Package {
    let name = loop {
        let mut name = String::new();
        for _ in 0..2 + rng.below(3) {
            name.push_str(rng.pick::<&str>(SYLLABLES));
        }
        if rng.unit() < 0.3 {
            name.push('-');
            name.push_str(rng.pick::<&str>(DIRS));
        }
        if rng.unit() < 0.12 {
            name = format!("{}/{name}", rng.pick(SCOPES));
        }
        if used.insert(name.clone()) {
            break name;
        }
    };
    let mut text = |rng: &mut Rng, median: f64| {
        *seeds += 1;
        let len = rng
            .log_normal(median, spec.sigma)
            .clamp(16.0, spec.max_bytes as f64) as usize;
        Content::Text {
            len,
            seed: spec.seed.wrapping_mul(1_000_003).wrapping_add(*seeds),
        }
    };
    let mut files = vec![
        ("package.json".to_owned(), text(rng, 1400.0)),
        ("README.md".to_owned(), text(rng, 4000.0)),
        ("index.js".to_owned(), text(rng, 600.0)),
    ];
    if rng.unit() < 0.85 {
        files.push(("LICENSE".to_owned(), Content::License(rng.below(40) as u32)));
    }
    let count = rng.log_normal(10.0, 1.2).clamp(1.0, 1500.0) as usize;
    let mut dirs: Vec<String> = Vec::new();
    let dir_count = count / 9;
    for _ in 0..dir_count {
        let parent = if dirs.is_empty() || rng.unit() < 0.4 {
            String::new()
        } else {
            format!("{}/", rng.pick(&dirs))
        };
        let depth = parent.matches('/').count();
        if depth >= 4 {
            continue;
        }
        let dir = format!("{parent}{}", rng.pick(DIRS));
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    for i in 0..count {
        let dir = if dirs.is_empty() || rng.unit() < 0.15 {
            String::new()
        } else {
            format!("{}/", rng.pick(&dirs))
        };
        let ext = *rng.pick(EXTS);
        let stem: String = (0..1 + rng.below(3))
            .map(|_| *rng.pick(SYLLABLES))
            .collect();
        let median = if ext == "js.map" {
            8000.0
        } else {
            spec.median_bytes
        };
        files.push((format!("{dir}{stem}{i}.{ext}"), text(rng, median)));
    }
    Package { name, dirs, files }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_is_deterministic_and_has_the_asked_files() {
        let spec = TreeSpec::npm(2000, 7);
        let a = generate(&spec, "/node_modules");
        let b = generate(&spec, "/node_modules");
        assert_eq!(a.ops, b.ops);
        assert_eq!(a.files, 2000);
        assert_eq!(a.files().count(), 2000);
        let paths: HashSet<&str> = a.files().map(|(p, _)| p).collect();
        assert_eq!(paths.len(), 2000, "paths repeat");
        assert!(a.dirs > 50, "{a:?}");
        assert!(a.duplicate_files > 0);
        assert_eq!(text_bytes(1000, 3), text_bytes(1000, 3));
        assert_eq!(text_bytes(1000, 3).len(), 1000);
    }
}
