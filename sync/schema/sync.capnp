# The replication protocol between an authoritative workspace (`computerd serve`) and
# its replicas (`computerd mount --remote`) and clients (`computerd fs --remote`).
#
# Entries are path *states* (see computer_vfs::changes): no file bytes travel inline;
# blocks travel on their own, only those the receiver lacks (haveBlocks / getBlocks).
# Every list and blob has a bound checked on decode (see sync/src/wire.rs).

@0xd6a3c9f0b2e47a15;

# Bumped whenever a message or method changes meaning; peers that differ refuse to talk.
const protocolVersion :UInt32 = 3;

struct Cursor {
  revision @0 :UInt64;
  path @1 :Data;
}

struct BlockRef {
  # BLAKE3 of the raw bytes; 32 zero bytes mark a hole of `len` bytes.
  hash @0 :Data;
  len @1 :UInt32;
}

struct Entry {
  revision @0 :UInt64;
  path @1 :Data;
  state :union {
    file :group {
      perm @2 :UInt32;
      mtime @3 :Int64;
      size @4 :UInt64;
      blocks @5 :List(BlockRef);
    }
    directory :group {
      perm @6 :UInt32;
      mtime @7 :Int64;
    }
    symlink @8 :Data;
    removed @9 :Void;
  }
  # How far the sender had applied the receiver's changes when it made this one (the
  # receiver's cursor): what the change was made against. Start (revision 0, empty path)
  # outside replication with a peer.
  base @10 :Cursor;
}

struct Block {
  hash @0 :Data;
  codec @1 :UInt8;
  rawLen @2 :UInt32;
  data @3 :Data;
}

struct Page {
  entries @0 :List(Entry);
  next @1 :Cursor;
  complete @2 :Bool;
  revision @3 :UInt64;
}

struct ClientInfo {
  # Identity of this replica's local state: a replica whose disk was lost and recreated
  # gets a new one, so changes held by the old one are never taken as synced.
  replicaId @0 :Text;
  # The peer this client syncs as (its cursor on the server); empty for plain clients.
  peer @1 :Text;
}

struct ServerInfo {
  version @0 :UInt32;
  workspaceId @1 :Text;
  revision @2 :UInt64;
  chunkMin @3 :UInt32;
  chunkAvg @4 :UInt32;
  chunkMax @5 :UInt32;
  # The server knew this peer under another replica id: that replica's cursors were
  # reset, and whatever it held unpushed is lost to the workspace.
  replaced @6 :Bool;
}

struct Conflict {
  # Both sides changed this path since they last agreed; the losing version was kept
  # under `keptAs`.
  path @0 :Data;
  keptAs @1 :Data;
}

# The first call on a connection. Refused, before anything else can be reached, unless
# the token matches; refused with a clear message if the versions differ.
interface Gate {
  hello @0 (version :UInt32, token :Data, client :ClientInfo) -> (session :Session, server :ServerInfo);
}

interface Session {
  # The states of paths changed after `after` (server to replica).
  changes @0 (after :Cursor, maxEntries :UInt32, maxBytes :UInt64) -> (page :Page);
  # Which blocks the server stores.
  haveBlocks @1 (hashes :List(Data)) -> (have :List(Bool));
  # Stored blocks, as stored (compressed or not).
  getBlocks @2 (hashes :List(Data)) -> (blocks :List(Block));
  # Replica to server: a batch of local states with the blocks the server lacks, applied
  # atomically; `through` is the replica's cursor after this batch, recorded in the same
  # transaction. Returns the server's record of it, and the conflicts it resolved.
  push @3 (entries :List(Entry), blocks :List(Block), through :Cursor) -> (applied :Cursor, conflicts :List(Conflict));
  # The replica applied the server's changes through `cursor` (never moves backwards).
  # Returns the server's record.
  ack @4 (cursor :Cursor) -> (acked :Cursor);
  # Calls `listener.changed` whenever the server's revision moves.
  watch @5 (listener :Listener) -> ();
  # Blocks sent ahead of the push whose entries use them (a transfer too large for one
  # push): stored, held until a push uses them or the server gives up on them.
  putBlocks @6 (blocks :List(Block)) -> (added :UInt32);
  # Retired in protocol version 3 (it ran a `computerd fs` command line and answered
  # with its output): servers answer it as unimplemented. The typed calls below replace
  # it; the ordinal stays taken.
  fs @7 (args :List(Data), stdin :Data) -> (stdout :Data, stderr :Data, status :Int32);

  # Typed file streams (protocol version 2), in bounded memory whatever the file's size:
  # the client moves a file in pieces of at most 1 MiB, each at an offset, so it may keep
  # several calls in flight. Failures name the path and carry an errno (see rpc.rs).

  # Opens the file at `path` (a final symlink followed) for reading.
  openRead @8 (path :Data) -> (reader :FileReader, size :UInt64);
  # Opens a stream to the file at `path`. Without `append` it replaces the file whole
  # when committed, and a writer dropped before that leaves the file as it was; with
  # `append` each piece lands after the end the file had when it was opened (created if
  # missing), as it arrives.
  openWrite @9 (path :Data, append :Bool) -> (writer :FileWriter);

  # Typed file operations (protocol version 2): what `computerd fs` does, one path
  # operation a call, each answer bounded. Paths as for the streams.

  # A node's attributes (`follow`: a final symlink followed).
  stat @10 (path :Data, follow :Bool) -> (node :Node);
  # A directory's entries with their attributes, at most `maxEntries` (and 4096) after
  # the position `after` (0: the start); `next` is where the following page starts.
  list @11 (path :Data, after :UInt64, maxEntries :UInt32) -> (entries :List(DirItem), next :UInt64, complete :Bool);
  mkdir @12 (path :Data, parents :Bool, perm :UInt32) -> ();
  remove @13 (path :Data, recursive :Bool, force :Bool) -> ();
  # rename(2): an existing target is replaced at once.
  rename @14 (from :Data, to :Data) -> ();
  # A copy sharing the source's blocks; the target must not exist.
  copy @15 (from :Data, to :Data, recursive :Bool) -> ();
  symlink @16 (target :Data, path :Data) -> ();
  link @17 (existing :Data, path :Data) -> ();
  chmod @18 (path :Data, perm :UInt32) -> ();
  truncate @19 (path :Data, size :UInt64) -> ();
  # The paths matching an absolute glob, at most `maxPaths` (and 65536) and 16 MiB;
  # `complete` is false if more matched.
  glob @20 (pattern :Data, maxPaths :UInt32) -> (paths :List(Data), complete :Bool);
  # Lines matching `pattern` in the files below `path`, at most `maxMatches` (and 65536)
  # and 16 MiB; `include` (a glob on file names) may be empty.
  grep @21 (pattern :Data, path :Data, regex :Bool, ignoreCase :Bool, maxMatches :UInt32, include :Data) -> (matches :List(GrepMatch), complete :Bool);

  # Operations on the whole workspace (protocol version 3).

  # What the workspace holds and what storing it costs.
  stats @22 () -> (stats :Stats);
  # Verifies every invariant of the database from scratch (reads every block): at most
  # 1000 problems listed, the rest counted.
  check @23 () -> (report :CheckReport);
  # Gives the pages deleted content freed back to the file system.
  compact @24 () -> (report :CompactReport);

  # Commands on the workspace (protocol version 3, optional): the server's runner, if
  # it runs any (`computerd` mounts do); others answer unimplemented.
  runner @25 () -> (runner :Runner);
}

# The exec entry point of a server (runtimes/ and docs/RUNTIMES.md): its backends, its
# execs and its audit trail. The server runs each command; the caller follows it.
interface Runner {
  backends @0 () -> (backends :List(BackendInfo));
  # Starts a command, or fails (a refusal, a pre-exec sync that could not finish) having
  # run nothing.
  exec @1 (request :ExecRequest) -> (exec :Exec, id :Text, backend :Text);
  # A running or recently finished exec, by id.
  attach @2 (id :Text) -> (exec :Exec, backend :Text);
  # The newest `limit` (at most 1000) audit records after `afterSeq`, oldest first.
  audit @3 (afterSeq :UInt64, limit :UInt32) -> (records :List(AuditItem));
  # Waits up to `waitMs` (at most 300000) for the writes of a result whose sync was
  # pending, named by its intent, on `backend` (empty: the default): `sync` is complete,
  # pending or lost, with `syncDetail` and `syncReason` as in ExecOutcome.
  waitSync @4 (backend :Text, intent :Text, waitMs :UInt32)
      -> (sync :Text, syncDetail :Text, syncReason :Text);
  # Runs the file tool `name` (read, write, edit, ls, find, grep: runtimes/src/tools)
  # with `arguments`, a JSON object as the tool's schema says, under the server's
  # policy, recorded in its audit trail; the answer is text for a model. A refusal or
  # a failure is an error naming the path, with its errno. Servers older than this
  # answer unimplemented.
  tool @5 (name :Text, arguments :Text) -> (text :Text);
}

struct BackendInfo {
  id @0 :Text;
  summary @1 :Text;
  runs @2 :Text;
  touches @3 :Text;
}

struct ExecRequest {
  # The script, run by `sh -c` in the Linux backend.
  script @0 :Text;
  # Empty: the default backend.
  backend @1 :Text;
  # Empty: the workspace's root.
  cwd @2 :Text;
  # At most 64 MiB.
  stdin @3 :Data;
  env @4 :List(EnvVar);
  # 0: none.
  timeoutMs @5 :UInt64;
  # Empty: the server picks one.
  id @6 :Text;
}

struct EnvVar {
  name @0 :Text;
  value @1 :Text;
}

interface Exec {
  # The events from sequence number `from` on: waits up to `waitMs` (at most 30000) for
  # the first, then returns those already there, at most 1 MiB of output. Ends with the
  # exit event; an empty list means the wait ran out.
  events @0 (from :UInt64, waitMs :UInt32) -> (events :List(ExecEvent));
  # A signal to the command's whole process tree (SIGKILL follows 3 s later).
  kill @1 (signal :Int32) -> ();
}

struct ExecEvent {
  union {
    output :group {
      seq @0 :UInt64;
      stderr @1 :Bool;
      data @2 :Data;
    }
    # Events first..next were dropped from the exec's bounded log.
    missed :group {
      first @3 :UInt64;
      next @4 :UInt64;
    }
    exit :group {
      seq @5 :UInt64;
      result @6 :ExecOutcome;
    }
  }
}

struct ExecOutcome {
  # completed, failed, cancelled, timed out
  status @0 :Text;
  exitCode @1 :Int32;
  durationMs @2 :UInt64;
  backend @3 :Text;
  reason @4 :Text;
  # complete, pending or lost; `syncDetail` the intent or the reason.
  sync @5 :Text;
  syncDetail @6 :Text;
  # Empty: nothing went wrong around the command.
  error @7 :Text;
  # Pending: why the last attempt failed.
  syncReason @8 :Text;
  # What a callable backend's command returned, as JSON text; unset for a shell's.
  value @9 :Text;
}

struct AuditItem {
  seq @0 :UInt64;
  atMs @1 :Int64;
  kind @2 :Text;
  subject @3 :Text;
  body @4 :Text;
}

struct Stats {
  workspaceId @0 :Text;
  files @1 :UInt64;
  directories @2 :UInt64;
  symlinks @3 :UInt64;
  otherNodes @4 :UInt64;
  # Sum of file sizes; bytes of distinct blocks before and after compression.
  logicalBytes @5 :UInt64;
  uniqueBytes @6 :UInt64;
  storedBytes @7 :UInt64;
  blocks @8 :UInt64;
  # The database's files on disk, and its pages that deleted content freed.
  databaseBytes @9 :UInt64;
  freeBytes @10 :UInt64;
  stagedFiles @11 :UInt64;
  revision @12 :UInt64;
}

struct CheckReport {
  nodes @0 :UInt64;
  blocks @1 :UInt64;
  blockBytes @2 :UInt64;
  # One line each.
  problems @3 :List(Text);
  problemsUnlisted @4 :UInt64;
}

struct CompactReport {
  # The database's pages before and after, free ones included.
  bytesBefore @0 :UInt64;
  bytesAfter @1 :UInt64;
  # Rewritten once to take incremental vacuum.
  rewrote @2 :Bool;
}

# A node as `stat` and `list` give it.
struct Node {
  # st_mode: the kind's S_IFMT bits and the permission bits.
  mode @0 :UInt32;
  ino @1 :UInt64;
  nlink @2 :UInt32;
  uid @3 :UInt32;
  gid @4 :UInt32;
  size @5 :UInt64;
  atime @6 :Int64;
  mtime @7 :Int64;
  ctime @8 :Int64;
  rdev @9 :UInt32;
  revision @10 :UInt64;
  # A symlink's target; empty for other kinds.
  target @11 :Data;
}

struct DirItem {
  name @0 :Data;
  node @1 :Node;
}

struct GrepMatch {
  path @0 :Data;
  lineNumber @1 :UInt64;
  line @2 :Data;
}

interface FileReader {
  # Up to `maxBytes` of the file from `offset`; fewer only at its end.
  read @0 (offset :UInt64, maxBytes :UInt32) -> (data :Data);
}

interface FileWriter {
  # Writes `data` at `offset` of the stream.
  write @0 (offset :UInt64, data :Data) -> ();
  # Puts what was written in place; returns the bytes written.
  commit @1 () -> (size :UInt64);
}

interface Listener {
  changed @0 (revision :UInt64) -> ();
}
