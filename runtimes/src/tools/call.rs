//! The tools as an agent host calls them: each tool's name, its description written for
//! a model, its arguments (a JSON object, whose schema the host shows the model), and
//! one entry point, [`Tools::call`], that takes a name and arguments and answers with
//! text. An adapter (`computerd mcp`) serves these; the owner of a workspace runs them.

use schemars::JsonSchema;
use serde::Deserialize;

use super::{Listed, Tools, LISTED_MAX};
use crate::error::{Error, Result};

pub const READ: &str = "read";
pub const WRITE: &str = "write";
pub const EDIT: &str = "edit";
pub const LS: &str = "ls";
pub const FIND: &str = "find";
pub const GREP: &str = "grep";
pub const EXEC: &str = "exec";

/// The file tools [`Tools::call`] runs, in the order a host lists them.
pub const FILE_TOOLS: [&str; 6] = [READ, WRITE, EDIT, LS, FIND, GREP];

/// Bytes of JSON arguments one call may carry (a `write` of a large file included);
/// larger files go in by `computerd fs write` or a command.
pub const ARGUMENTS_BYTES_MAX: usize = 16 << 20;

pub const READ_DESCRIPTION: &str = "Read a text file of the workspace. Lines come numbered \
(`     7\\tcode`), at most 2000 per call; when more follow, a last line says which were \
shown and the `offset` to read on from. Lines over 2000 characters are cut. A binary file \
is refused with its size. Paths are from the workspace root (`src/main.rs`); commands see \
the same file at `/workspace/src/main.rs`, and that form works too.";

pub const WRITE_DESCRIPTION: &str = "Create a file, or replace one whole, with `content`. \
Readers see the old file or the new one, never a mix; missing parent directories are \
made. To change part of an existing file, use `edit`.";

pub const EDIT_DESCRIPTION: &str = "Replace one span of a text file: `old_text` must appear \
exactly once in the file (copy it exactly, with enough surrounding lines to make it \
unique) and becomes `new_text`. Answers with the change as a unified diff. If `old_text` \
appears nowhere or more than once, nothing changes and the error says how many times it \
appeared.";

pub const LS_DESCRIPTION: &str = "List a directory (default: the workspace root), sorted by \
name, one entry a line: `name/` for a directory, `name@` for a symbolic link, `name  SIZE` \
(bytes) for a file. At most 1000 entries; a last line says when there are more.";

pub const FIND_DESCRIPTION: &str = "Find paths by glob: `**/*.rs` (any depth), `src/*.toml`, \
`**/test_*.py`, from the workspace root or from `path`. Answers the matching paths \
sorted, one a line, at most 1000; a last line says when more matched.";

pub const GREP_DESCRIPTION: &str = "Search file contents for a regular expression (Rust \
regex syntax: `fn \\w+\\(`, `(?i)todo`) in a file or in every file under a directory \
(default: the whole workspace); `include` keeps only files whose names match a glob \
(`*.rs`). Answers `path:line:text` lines, sorted by path, at most 1000; a last line says \
when more matched.";

pub const EXEC_DESCRIPTION: &str = "Run a command with bash on the workspace, which it sees \
at /workspace (its working directory, unless `cwd` names another). Its output arrives as \
progress notifications while it runs; the answer gives how it ended (exit code, status, \
the backend that ran it and why), its stdout and stderr (each cut to 128 KiB, keeping \
the start and the end), and whether its changes are in the workspace (sync). The \
`js` backend runs `command` as the source of an ES module instead: its default export \
gets `input` and its value is in the answer.";

/// `read`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadArgs {
    /// The file: `src/main.rs`, `/src/main.rs` or `/workspace/src/main.rs`.
    pub path: String,
    /// The first line to show, counting from 1 (default 1).
    #[serde(default)]
    pub offset: Option<usize>,
    /// How many lines to show (default and most: 2000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// `write`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteArgs {
    /// The file to create or replace.
    pub path: String,
    /// The file's whole new content.
    pub content: String,
}

/// `edit`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditArgs {
    /// The file to change.
    pub path: String,
    /// The text to replace, exactly as it is in the file; it must appear once.
    pub old_text: String,
    /// What replaces it (empty: delete it).
    pub new_text: String,
}

/// `ls`'s arguments.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LsArgs {
    /// The directory (default: the workspace root).
    #[serde(default)]
    pub path: Option<String>,
}

/// `find`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindArgs {
    /// The glob: `**/*.rs`, `src/*.toml`.
    pub pattern: String,
    /// The directory the glob starts from (default: the workspace root).
    #[serde(default)]
    pub path: Option<String>,
}

/// `grep`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepArgs {
    /// The regular expression (Rust regex syntax; `(?i)` for any case).
    pub pattern: String,
    /// A file, or a directory searched to any depth (default: the workspace root).
    #[serde(default)]
    pub path: Option<String>,
    /// Only files whose names match this glob (`*.rs`, `*.{ts,tsx}`).
    #[serde(default)]
    pub include: Option<String>,
}

/// A tool as an agent host lists it.
#[derive(Clone, Debug)]
pub struct ToolSpec {
    pub name: &'static str,
    pub description: &'static str,
    /// The JSON Schema (draft 2020-12) of its arguments, an object.
    pub input_schema: serde_json::Map<String, serde_json::Value>,
    /// It changes nothing.
    pub read_only: bool,
}

/// Every tool: the file tools [`Tools::call`] runs, then `exec` (an exec of the spine
/// with [`super::ExecArgs`]).
pub fn catalog() -> Vec<ToolSpec> {
    vec![
        spec::<ReadArgs>(READ, READ_DESCRIPTION, true),
        spec::<WriteArgs>(WRITE, WRITE_DESCRIPTION, false),
        spec::<EditArgs>(EDIT, EDIT_DESCRIPTION, false),
        spec::<LsArgs>(LS, LS_DESCRIPTION, true),
        spec::<FindArgs>(FIND, FIND_DESCRIPTION, true),
        spec::<GrepArgs>(GREP, GREP_DESCRIPTION, true),
        spec::<super::ExecArgs>(EXEC, EXEC_DESCRIPTION, false),
    ]
}

fn spec<T: JsonSchema>(name: &'static str, description: &'static str, read_only: bool) -> ToolSpec {
    let generator = schemars::generate::SchemaSettings::draft2020_12().into_generator();
    let schema = serde_json::to_value(generator.into_root_schema_for::<T>());
    let Ok(serde_json::Value::Object(input_schema)) = schema else {
        unreachable!("a derived schema of a struct is a JSON object");
    };
    ToolSpec {
        name,
        description,
        input_schema,
        read_only,
    }
}

impl Tools {
    /// Runs the file tool `name` with `arguments` (a JSON object as its `*Args` type
    /// says) and answers with text for a model; `caller` names who asked in the audit
    /// record. An unknown tool or arguments that do not fit are errors that say so.
    pub fn call(&self, name: &str, arguments: &str, caller: &str) -> Result<String> {
        if arguments.len() > ARGUMENTS_BYTES_MAX {
            return Err(Error::Invalid(format!(
                "{name}: arguments of {} bytes, more than the {} MiB a call may carry \
                 (write a larger file with a command)",
                arguments.len(),
                ARGUMENTS_BYTES_MAX >> 20
            )));
        }
        let tools = self.for_caller(caller);
        match name {
            READ => {
                let args: ReadArgs = parse(name, arguments)?;
                tools.read(&args.path, args.offset.unwrap_or(1), args.limit)
            }
            WRITE => {
                let args: WriteArgs = parse(name, arguments)?;
                tools.write(&args.path, args.content.as_bytes())
            }
            EDIT => {
                let args: EditArgs = parse(name, arguments)?;
                tools.edit(&args.path, &args.old_text, &args.new_text)
            }
            LS => {
                let args: LsArgs = parse(name, arguments)?;
                let (entries, cut) = tools.ls(args.path.as_deref().unwrap_or("/"))?;
                Ok(ls_text(&entries, cut))
            }
            FIND => {
                let args: FindArgs = parse(name, arguments)?;
                let (paths, cut) = tools.find(&args.pattern, args.path.as_deref())?;
                Ok(find_text(&paths, cut))
            }
            GREP => {
                let args: GrepArgs = parse(name, arguments)?;
                let path = args.path.as_deref().unwrap_or("/");
                let (text, cut) = tools.grep(&args.pattern, path, args.include.as_deref())?;
                Ok(grep_text(text, cut))
            }
            other => Err(Error::Invalid(format!(
                "{other}: no such tool (the tools are {})",
                FILE_TOOLS.join(", ")
            ))),
        }
    }
}

/// `arguments` as the tool's argument type, or an error naming the tool and what did
/// not fit.
pub fn parse<T: serde::de::DeserializeOwned>(tool: &str, arguments: &str) -> Result<T> {
    let arguments = if arguments.trim().is_empty() {
        "{}"
    } else {
        arguments
    };
    serde_json::from_str(arguments)
        .map_err(|err| Error::Invalid(format!("{tool}: the arguments do not fit: {err}")))
}

fn ls_text(entries: &[Listed], cut: bool) -> String {
    let mut text = String::new();
    for entry in entries {
        let line = match entry.kind {
            "dir" => format!("{}/\n", entry.name),
            "symlink" => format!("{}@\n", entry.name),
            "file" => format!("{}  {}\n", entry.name, entry.size),
            _ => format!("{}\n", entry.name),
        };
        text.push_str(&line);
    }
    if entries.is_empty() {
        text.push_str("[empty directory]\n");
    }
    if cut {
        text.push_str(&format!(
            "[the first {LISTED_MAX} entries; there are more]\n"
        ));
    }
    text
}

fn find_text(paths: &[String], cut: bool) -> String {
    let mut text: String = paths.iter().map(|p| format!("{p}\n")).collect();
    if paths.is_empty() {
        text.push_str("[no path matches]\n");
    }
    if cut {
        text.push_str(&format!(
            "[the first {LISTED_MAX} paths; more match: narrow the pattern]\n"
        ));
    }
    text
}

fn grep_text(mut text: String, cut: bool) -> String {
    if text.is_empty() {
        text.push_str("[no line matches]\n");
    }
    if cut {
        text.push_str("[more lines match: narrow the pattern, the path or include]\n");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_that_do_not_fit_say_which_tool_and_why() {
        let err = parse::<ReadArgs>(READ, r#"{"path": "a", "lines": 3}"#).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("read: the arguments do not fit: unknown field `lines`"),
            "{err}"
        );
        let err = parse::<EditArgs>(EDIT, r#"{"path": "a"}"#).unwrap_err();
        assert!(
            err.to_string().contains("missing field `old_text`"),
            "{err}"
        );
        let none: LsArgs = parse(LS, "").unwrap();
        assert!(none.path.is_none());
    }

    #[test]
    fn every_tool_has_an_object_schema_naming_its_required_arguments() {
        let catalog = catalog();
        let names: Vec<&str> = catalog.iter().map(|t| t.name).collect();
        assert_eq!(names, [READ, WRITE, EDIT, LS, FIND, GREP, EXEC]);
        for tool in &catalog {
            assert_eq!(tool.input_schema["type"], "object", "{}", tool.name);
            assert!(!tool.description.is_empty());
        }
        let edit = &catalog[2].input_schema;
        assert_eq!(
            edit["required"],
            serde_json::json!(["path", "old_text", "new_text"])
        );
        assert!(edit["properties"]["old_text"]["description"]
            .as_str()
            .unwrap()
            .contains("appear once"));
    }

    #[test]
    fn listings_mark_kinds_and_say_when_cut() {
        let entries = [
            Listed {
                name: "src".into(),
                kind: "dir",
                size: 0,
            },
            Listed {
                name: "a.txt".into(),
                kind: "file",
                size: 12,
            },
            Listed {
                name: "l".into(),
                kind: "symlink",
                size: 3,
            },
        ];
        assert_eq!(ls_text(&entries, false), "src/\na.txt  12\nl@\n");
        assert!(ls_text(&entries, true).ends_with("there are more]\n"));
        assert_eq!(ls_text(&[], false), "[empty directory]\n");
        assert_eq!(find_text(&[], false), "[no path matches]\n");
        assert_eq!(grep_text(String::new(), false), "[no line matches]\n");
    }
}
