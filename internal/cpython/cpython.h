// The C half of minipy's in-process engine. One OS thread (the "owner", a locked goroutine
// that never returns from mp_serve) initialises CPython and runs every request; callers on
// other threads hand requests over through a single slot and futexes, so a run costs one
// cgo call to submit and one to wait, with no Go channel or scheduler hop in between.
#ifndef MINIPY_CPYTHON_H
#define MINIPY_CPYTHON_H

#include <stddef.h>
#include <stdint.h>

// mp_serve initialises CPython on the calling thread with the runtime source and the file
// name its code carries (pyrt.RuntimeFile), the python executable to report as
// sys.executable and to find the standard library from ("" leaves CPython's guess) and the
// kick signal,
// then serves requests forever. It returns only if initialisation failed; mp_init_wait
// reports the outcome to the starter.
void mp_serve(const char *runtime_src, const char *runtime_file, const char *executable, int kick_signal);

// mp_init_wait blocks until mp_serve has initialised (returns 1) or failed (returns 0,
// with the reason in mp_init_error()).
int mp_init_wait(void);
const char *mp_init_error(void);

// mp_submit hands a request (malloc'd; the slot owns it from now on) to the owner and
// returns its generation. The caller must hold the Go side's interpreter token. host_calls
// says whether the request's code may call host functions (a run in a namespace that has
// some); otherwise _minipy_c.host_call refuses at once.
uint64_t mp_submit(char *req, size_t len, int host_calls);

// mp_wait waits until the request of generation gen is done, it has events queued (only
// when events is non-zero), mp_wake is called, or timeout_ns passes (negative: no limit).
// Returns 1 when the request is done, 2 when events wait (mp_events), else 0.
int mp_wait(uint64_t gen, int64_t timeout_ns, int events);

// mp_host_next waits up to timeout_ns (negative: no limit) for a host call no server has
// taken and returns its event (malloc'd, the caller frees it; NULL on timeout): a frame of
// kind 'C' (u32 length, kind, u64 generation, u64 call id, payload).
char *mp_host_next(int64_t timeout_ns, size_t *len);

// mp_reply answers host call id with a status (pyrt's Call*) and payload, which it copies.
// A call that is no longer waiting (its run was stopped) is ignored.
void mp_reply(uint64_t id, int status, const char *payload, size_t len);

// mp_events takes the events the current request queued, as frames (u32 length, kind,
// u64 generation, payload; malloc'd, the caller frees it, NULL when none), and the bytes of
// output dropped because the queue was full.
char *mp_events(size_t *len, uint64_t *dropped);

// mp_wake wakes every mp_wait (used when a caller's context is cancelled).
void mp_wake(void);

// mp_kick interrupts the request of generation gen if it is still running: stage 1 raises
// the timeout once, stage 2 raises it on every line (code that swallowed stage 1).
void mp_kick(uint64_t gen, int stage);

// mp_take returns the response of the finished request gen (malloc'd, the caller frees it)
// and whether it was kicked, then frees the request and empties the slot.
char *mp_take(uint64_t gen, size_t *len, int *kicked);

// mp_libpython_file is the file the C API was loaded from (the shared libpython, or the
// program itself when libpython is linked statically), or NULL. It needs no interpreter.
const char *mp_libpython_file(void);

// ---- the isolated engine's fork code ---------------------------------------------------
//
// mp_fork_code is machine code for the isolated engine's workers, not for this process: the
// host sends its bytes (cpython.go's ForkCode) to each local worker's python, which copies
// them into an executable mapping and calls them through ctypes, holding the GIL (worker.py's
// _ForkCode). It forks (the table's OP): a rollback snapshot that runs no Python until it
// takes over, or, in the template, a new sandbox whose set-up runs no Python (template.py's
// _serve_template); and it serves a worker's requests between its snapshots (calling Python
// for each request's answer alone). So it must run at any address, in any python: it reaches
// nothing outside itself but through the table it is given (no globals, no literals, no
// calls but through the table's pointers, no stack protector, no jump tables), and it calls
// only C API that every CPython 3.7+ has.
//
// The table: int64 slots, at these indices (worker.py's _FT_*, pinned by a test). Strings
// are pointers to NUL-terminated bytes.
enum {
	MP_FT_BEFORE_FORK,    // PyOS_BeforeFork
	MP_FT_AFTER_PARENT,   // PyOS_AfterFork_Parent
	MP_FT_AFTER_CHILD,    // PyOS_AfterFork_Child
	MP_FT_FORK,           // fork
	MP_FT_CLOSE,          // close
	MP_FT_RECVMSG,        // recvmsg
	MP_FT_EXIT,           // _exit
	MP_FT_ERRNO,          // __errno_location
	MP_FT_SOCK,           // the socket the snapshot waits on for its take-over
	MP_FT_KIND,           // the take-over message's first byte
	MP_FT_WANT,           // the number of fds it carries
	MP_FT_NCLOSE,         // how many of CLOSE's fds the snapshot closes first (at most 8)
	MP_FT_CLOSE_FDS,      // 8 slots: the worker's pipes, which the snapshot must not hold
	MP_FT_FDS = MP_FT_CLOSE_FDS + 8,  // 8 slots: the fds the take-over brought (out)
	MP_FT_OP = MP_FT_FDS + 8,  // MP_OP_*
	MP_FT_SYSCALL,        // syscall
	// A new sandbox (MP_OP_SANDBOX), as sandbox.py's _become_tenant makes it:
	MP_FT_S_FDS,          // 6 slots: its stdin, stdout, stderr, control socket, control pipe, life pipe
	MP_FT_S_NCG = MP_FT_S_FDS + 6,  // how many cgroup.procs fds follow (at most 2)
	MP_FT_S_CG,           // 2 slots: the cgroup.procs of its group in each hierarchy
	MP_FT_S_TREES = MP_FT_S_CG + 2,  // the engine's trees (the config's tree)
	MP_FT_S_TREE,         // its tree's name in them
	MP_FT_S_HOME,         // its working directory's name in its tree
	MP_FT_S_WORKDIR,      // where its working directory is bound
	MP_FT_S_MAPS,         // 6 slots: a file of /proc/self and what to write to it, 3 times
	MP_FT_S_UNSHARE = MP_FT_S_MAPS + 6,  // the namespaces its pid 1 is made in (CLONE_*)
	MP_FT_S_PORT,         // the egress listener's port on 127.0.0.1 (0: none)
	MP_FT_S_LISTEN,       // the first byte of the message that hands it to the host
	MP_FT_S_HOSTNAME,     // its host name
	MP_FT_S_PROC,         // "proc"
	MP_FT_S_PROC_DIR,     // "/proc"
	MP_FT_S_TMPFS,        // "tmpfs"
	MP_FT_S_TMP_DIRS,     // 2 slots: "/tmp", "/dev/shm"
	MP_FT_S_TMP_DATA = MP_FT_S_TMP_DIRS + 2,  // their mount options
	MP_FT_S_FD_PATH,      // "/proc/self/fd/"
	MP_FT_S_NCOVERED,     // how many of the template's binds the working directory and tmpfs cover (at most 16)
	MP_FT_S_COVERED,      // an array of their paths, shortest first, bound again on top
	MP_FT_S_COVERED_DIR,  // an array of int64: each a directory (1) or a file (0)
	MP_FT_S_FILTER,       // the seccomp filter (struct sock_fprog)
	MP_FT_S_LIFE,         // the last fd it keeps (the life pipe's, 5)
	MP_FT_S_WHY,          // an array of strings: MP_SS_*'s names, for the message of a failure
	// The sandbox's guardian in C (guardian.py's _Guardian while it has nothing else to do):
	MP_FT_G_CTL,          // the host's control socket (3)
	MP_FT_G_KICK,         // the worker's control pipe (4), which the guardian closes
	MP_FT_G_REPORT,       // the first byte of a worker's snapshot report (b"S" u32 pid, u32 number, u8 died)
	MP_FT_G_SNAP_DIED,    // the first byte of the message that tells the host a snapshot had died
	MP_FT_G_OOM_SELF,     // "/proc/self/oom_score_adj"
	MP_FT_G_OOM_PID,      // 2 slots: "/proc/", "/oom_score_adj"
	MP_FT_G_WORKER = MP_FT_G_OOM_PID + 2,  // (out) the worker's pid in the guardian, 0 in the worker
	MP_FT_G_V,            // (out) the guardian's end of the reports' socket; the worker's, in the worker
	MP_FT_G_SNAP,         // (out) the worker's snapshot's pid, 0: none
	MP_FT_G_GEN,          // (out) its number
	// The template's loop in C (MP_OP_TEMPLATE: template.py's _serve_template while all it
	// does is make sandboxes and mount their working directories):
	MP_FT_T_NEW,          // the first byte of the host's message that asks for a new sandbox
	MP_FT_T_MOUNT,        // ... that asks for a working directory's tmpfs, and of the answer
	MP_FT_T_REFUSED,      // the first byte of a refusal
	MP_FT_T_MOVED,        // a refusal's text: the tmpfs moved while it was mounted
	MP_FT_T_DATA,         // 3 slots: a tree's tmpfs options, up to the size; a working directory's; ",nr_inodes="
	MP_FT_T_SFD = MP_FT_T_DATA + 3,  // a signalfd of SIGCHLD, made once (-1 before)
	MP_FT_T_MASK,         // (out) the signal mask the loop found, the forks' own
	// A local worker's loop in C (MP_OP_SERVE: worker.py's _Worker.serve). Its snapshots
	// are MP_OP_SNAPSHOT's (SOCK, KIND, WANT, NCLOSE, CLOSE_FDS; FDS out), reported as the
	// guardian expects (G_REPORT; G_SNAP, G_GEN in and out).
	MP_FT_W_SAVE,         // PyEval_SaveThread
	MP_FT_W_RESTORE,      // PyEval_RestoreThread
	MP_FT_W_NEW_BYTES,    // PyBytes_FromStringAndSize
	MP_FT_W_BYTES_AT,     // PyBytes_AsString
	MP_FT_W_CALL,         // PyObject_CallFunctionObjArgs
	MP_FT_W_DECREF,       // Py_DecRef
	MP_FT_W_GET_BUF,      // PyObject_GetBuffer
	MP_FT_W_REL_BUF,      // PyBuffer_Release
	MP_FT_W_TUPLE_LEN,    // PyTuple_Size
	MP_FT_W_TUPLE_AT,     // PyTuple_GetItem
	MP_FT_W_SIGNALS,      // PyErr_CheckSignals
	MP_FT_W_STRERROR,     // strerror
	MP_FT_W_HANDLE,       // the Python callable that answers a request (worker.py's _Worker.handle)
	MP_FT_W_NONE,         // None
	MP_FT_W_IN,           // the request pipe
	MP_FT_W_OUT,          // the answer pipe
	MP_FT_W_ERR,          // the host's stderr pipe
	MP_FT_W_SNAPSHOTS,    // whether to fork a rollback snapshot after a request that may change the state
	MP_FT_W_CHANGED,      // (in, out) the last request may have changed the state: snapshot before the next
	MP_FT_W_CHANGED_BIT,  // the answer's flag that says so (ANSWER_CHANGED), in its header's last byte
	MP_FT_W_NO_SNAP,      // the text that says a snapshot's fork failed, up to its error
	MP_FT_W_PAGES,        // (in, out) an int64 array: the pages noted last, to copy ahead (see MP_OP_SERVE)
	MP_FT_W_PREV,         // (in, out) another: the ones noted before (the two swap at each notes)
	MP_FT_W_PAGES_CAP,    // their length
	MP_FT_W_NPAGES,       // (in, out) how many PAGES holds
	MP_FT_W_NPREV,        // (in, out) how many PREV holds
	MP_FT_W_AHEAD,        // (in, out) how many pages were copied ahead, all told
	MP_FT_W_CYCLE,        // (in, out) the snapshots forked, all told: which eighth of the pages is not copied ahead
	MP_FT_W_SCRATCH,      // 12 KiB for the notes' and the requests' reads (as PAGES and PREV, memory no snapshot shares: each cycle writes it)
	MP_FT_W_MAPS,         // "/proc/self/maps"
	MP_FT_W_PAGEMAP,      // "/proc/self/pagemap"
	MP_FT_W_NREAPED,      // (in, out) how many of UNREAPED's slots are used
	MP_FT_W_UNREAPED,     // 8 slots: replaced snapshots, killed, not reaped yet
	// A new sandbox again (MP_OP_SANDBOX; slots added after the rest):
	MP_FT_S_BOOT_ID = MP_FT_W_UNREAPED + 8,  // 2 slots: the file its boot id is made in, the path it is bound over
	// Its own root (mp_own_root, sandbox.py's _own_root): what it holds of the template's root,
	MP_FT_S_ROOT_N = MP_FT_S_BOOT_ID + 2,  // how many names (at most 64)
	MP_FT_S_ROOT_KINDS,   // an array of int64: each name's MP_RK_*
	MP_FT_S_ROOT_NAMES,   // an array of its names, each "/" and the name
	MP_FT_S_ROOT_LINKS,   // an array of a link's target (MP_RK_LINK), else 0
	MP_FT_S_ROOT_OPTS,    // 4 strings: "mode", its mode, "size", its size in bytes (TmpSize)
	MP_FT_S_ROOT_AT,      // where it is attached while it is made ("/tmp")
	MP_FT_S_ROOT_PROC,    // its /proc while it is made ("/tmp/proc")
	// A sandbox with a root user (sandbox.py's _root_namespace says how it is made):
	MP_FT_S_USERNS,       // the template's user namespace its namespaces are made in (an fd), 0: none (a namespace of its own)
	MP_FT_S_IDMAP,        // the uid_map and gid_map of its pid 1's user namespace ("0 ROOT 1\nUSER USER 1")
	MP_FT_S_ID_FILES,     // 2 slots: "/uid_map", "/gid_map" (after its pid under /proc)
	MP_FT_S_ROOT_HOME = MP_FT_S_ID_FILES + 2,  // root's home ("/root"), made root's
	MP_FT_S_CAP_LAST,     // the highest capability's number (/proc/sys/kernel/cap_last_cap)
	MP_FT_S_SYNC,         // 2 slots: (out, in pid 1) its ends of the pipes to and from the fork that maps its ids
	MP_FT_S_LOW_PORTS = MP_FT_S_SYNC + 2,  // its network's ip_unprivileged_port_start, set to 0 (its root binds below 1024)
	MP_FT_SIZE,
};

enum { MP_OP_SNAPSHOT, MP_OP_SANDBOX, MP_OP_TEMPLATE, MP_OP_SERVE };

// The steps of a sandbox's set-up in C; a failure writes "...failed: " + the step's name
// (worker.py's _SS_*, pinned by a test) + its errno to the new stderr and exits 70.
enum {
	MP_SS_SETSID, MP_SS_CGROUP, MP_SS_TREE_NS, MP_SS_TREE_SLAVE, MP_SS_TREE_OPEN, MP_SS_TREE_COPY,
	MP_SS_TREE_DETACH, MP_SS_TREE_MOVE, MP_SS_USERNS, MP_SS_MAPS, MP_SS_UNSHARE, MP_SS_EGRESS,
	MP_SS_FORK, MP_SS_HOSTNAME, MP_SS_PROC, MP_SS_HOME, MP_SS_BIND_HOME, MP_SS_TMPFS, MP_SS_COVERED,
	MP_SS_CAPS, MP_SS_SECCOMP, MP_SS_FDS, MP_SS_GUARDIAN, MP_SS_DUMPABLE, MP_SS_TEMPLATE_FORK, MP_SS_BOOT_ID,
	MP_SS_ROOT, MP_SS_ROOT_HOME, MP_SS_COUNT,
};

// The kinds of a name at a sandbox's own root (MP_FT_S_ROOT_KINDS; sandbox.py's _root_layout).
enum { MP_RK_DIR, MP_RK_LINK, MP_RK_COPY_DIR, MP_RK_COPY_FILE };

// mp_fork_code forks; the parent returns the child's pid, or -errno.
//
// MP_OP_SNAPSHOT: the child closes the worker's pipes, waits on the socket for the take-over
// message (other messages' fds are closed; the socket's end or error ends it, _exit(0)),
// runs PyOS_AfterFork_Child only then, and returns 0 with the message's fds in the table.
//
// MP_OP_SANDBOX: the child (T) joins the cgroups, leaves its own tree alone in a mount
// namespace of its own, makes a user namespace mapping its user alone and the rest (and the
// egress listener), forks the sandbox's pid 1 and exits; pid 1 names the host, mounts its
// /proc, working directory and tmpfs, drops every capability, applies the seccomp filter,
// takes its six fds as 0-5, closes every other, and forks the worker, which runs
// PyOS_AfterFork_Child and returns 0 (G_WORKER 0, G_V its end of the reports' socket). pid 1
// stays in C as the guardian while all it does is the common case: it takes the worker's
// snapshot reports (gives each snapshot its OOM score, tells the host of one that had died),
// reaps the snapshots, and exits when the host closes the control socket (the kernel kills
// the rest of the pid namespace). Anything else (the worker's end, a message of the host's
// but its end, a report that is not a snapshot's) it leaves unread and hands over to Python:
// it runs PyOS_AfterFork_Child then and returns 0 with G_WORKER, G_V, G_SNAP and G_GEN set,
// and guardian.py's _Guardian goes on from there.
//
// MP_OP_TEMPLATE: the template's loop. It serves the control socket (G_CTL) as template.py's
// _serve_template does while the host asks only for new sandboxes (forked as MP_OP_SANDBOX,
// returning 0 in them as there) and working directories' tmpfs (mounted, their root's fd
// sent), and reaps its children. It returns 1, with the message it has not read, for
// anything else: another message, one it refuses to guess at (a bad name or size, a mount
// the kernel refused: template.py answers those, with the reason), the socket's end.
//
// MP_OP_SERVE: a local worker's loop, so that the pages a rollback cycle writes are the
// run's and few more (each is a copy-on-write fault: docs/benchmarks.md). Before each
// request, when the last one may have changed the state (W_CHANGED), it forks a snapshot as
// MP_OP_SNAPSHOT does, reports it to the guardian and kills and reaps the one it replaces;
// then it reads the request's frame from W_IN with the GIL released, into a new bytes
// object, calls W_HANDLE with it, and writes the tuple of buffers it returns (the answer's
// frame, its header first) to W_OUT, the GIL released. It ends the process at the request
// pipe's end, as worker.py does. Each page the worker writes after a snapshot's fork is
// copied at its first write, and a run writes much the same pages each time: so before the
// fork it notes the pages written since the last one (those /proc/self/pagemap shows
// exclusively mapped, up to W_PAGES_CAP), and after it copies them ahead
// (MADV_POPULATE_WRITE), the GIL released, until a request comes: the next run finds them
// copied. A page copied ahead is exclusively mapped whether the run writes it or not, so
// only pages noted twice in a row are copied ahead (a page written once is left to the
// run), and of those an eighth (by address, another each time) is left to the run too: the
// ones it does not write drop out of the next notes, so no page is copied for nothing more
// than 8 times in a row. It returns 1 in a snapshot that took over (FDS), 0 when
// W_HANDLE returned None (the worker goes on in Python: a Fork's copy on its own pipes),
// -1 with Python's error set, or -errno of a read or write that failed.
long mp_fork_code(int64_t *t);

#endif
