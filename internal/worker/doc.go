// Package worker starts and speaks to the isolated engine's worker processes: the
// commands and their sandbox (Linux namespaces, set up by pyrt's sandbox.py), the frames on a
// worker's pipes, the control socket to its guardian (pyrt's Control* kinds), the template
// that sandboxed workers are forked from, and killing a process tree. The root package keeps
// the public API and the engine's logic: which namespaces a worker holds, runs, rollback
// and Fork as the user sees them, working directories. docs/protocol.md describes the
// protocol itself.
//
// # Ownership
//
//   - A Spec is made once per engine (PrepareMounts is the last step of making it) and never
//     changed; its methods are safe from any goroutine. It holds the user namespaces of its
//     idmapped Mounts (idmap.go) until its Close, which its engine calls as it closes.
//   - A Worker has one owner at a time: the engine's worker slot, while it holds the slot's
//     token (the template: the engine, under its template lock; one AskMount at a time).
//     Only the owner reads frames (ReadFrame), numbers requests (NextRun), reads and writes
//     Known, and calls Answered, KillWorker, AwaitDeath, RollBack and Copy. Send, Reply,
//     Wake, Kill, AwaitExit, Gone, Ended, Pid, Stderr and Status are safe from any
//     goroutine: a deadline's watchdog wakes and kills a worker its owner waits on.
//   - A Worker owns its pipes and control socket; RollBack hands them on to the worker it
//     returns, and Kill closes the host's side. Its goroutines (the reaper, the stderr
//     reader, the guardian's reports, a Command worker's beats) end when the process ends.
//   - Every process this package starts ends with its Worker's Kill: a sandboxed worker
//     is pid 1 of its pid namespace, whose end the kernel makes everyone's in it; a worker
//     forked from the template ends with its guardian, which ends when the last control
//     socket of its lines closes; an unsandboxed local worker's descendants are killed by
//     the rule of pyrt's proctree.py (killDescendants); a Command worker's far side ends when
//     its connection closes, or after a bounded silence of its host (Beats).
package worker
