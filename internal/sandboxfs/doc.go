// Package sandboxfs holds a sandbox's files on the host's side: the namespaces' working
// directories, in trees of one per worker sandbox, each a tmpfs of WorkSize bytes that the
// engine's template mounts (Trees), moved when the template dies; and how the host reaches
// them on the code's behalf, and the sandbox's own places (/tmp, /dev/shm, its root): each
// open as a Root, whose every name the kernel resolves beneath it (openat2,
// RESOLVE_BENEATH); the walks that copy them and write them to and from tar archives (Save,
// Restore, pause, Fork); the watches that find what a run changed (Changes, for
// Result.Files) and that report changes as they come (WatchDir).
//
// What it must stop: the code may leave anything in its files, and change them while the
// host works on them. A link (relative, absolute, a /proc magic link) never leads the host
// out of the root; a link swapped in for a directory mid-walk is removed or left, never
// walked; a FIFO never hangs the host; a sparse file never makes the host read or hold more
// than the directory may hold (Root.Limit); a mount in a sandbox's place (the host's files
// bound there) is never entered (Root.NoXdev); a directory of mode 0 or a name too long
// is skipped, never fatal. A host thread acting in a sandbox's tmpfs takes the sandbox
// user's fsuid (ActAs), so a root host has no more reach there than the code, except the
// sandbox root's own (DAC capabilities, re-raised for that thread alone).
//
// The minipy package keeps the API (Namespace's file methods, FileInfo, FileEvent, the
// errors); this package holds the mechanics, and no policy of which engine may use them.
package sandboxfs
