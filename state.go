package minipy

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/minipy-go/minipy/internal/pyrt"

	"github.com/minipy-go/minipy/internal/sandboxfs"
)

// Saving and restoring a namespace (docs/state.md has the format). A saved namespace is
// the magic, the format's version, and frames (state_stream.go). Format 1, which minipy
// wrote before, is still read:
//
//	"minipyNS"          8 bytes, the magic
//	u16                 1
//	sections            each a kind byte, a u64 length and that many bytes:
//	                    'H' the header (JSON, stateHeader), first;
//	                    'V' the variables (a pickle, internal/pyrt/state.py);
//	                    'F' the working directory's files (a tar archive), if any
//	tag                 32 bytes: HMAC-SHA256 of everything before it, under the state key
//
// All integers are little-endian.

const (
	stateMagic    = "minipyNS"
	stateFormat   = 2 // what Save writes
	stateFormatV1 = 1
	stateTagLen   = sha256.Size
)

// stateHeader is a saved namespace's header section.
type stateHeader struct {
	Python  string            `json:"python"` // major.minor of the Python that saved it
	Engine  string            `json:"engine"` // "in-process" or "isolated"
	Saved   []string          `json:"saved"`
	Skipped map[string]string `json:"skipped,omitempty"` // name -> why
	Hosts   []string          `json:"hosts,omitempty"`   // host functions' names
	Files   int               `json:"files,omitempty"`   // entries of the files section (format 1)
}

// SaveInfo says what Namespace.Save saved.
type SaveInfo struct {
	// Saved names the variables saved.
	Saved []string
	// Skipped names the variables whose values cannot be saved: generators, open files,
	// sockets, locks, threads and anything else pickle refuses, or that holds one.
	Skipped []string
	// Reasons says why, for each name in Skipped.
	Reasons map[string]string
	// HostFunctions names the host functions bound in the namespace: they are the host's,
	// not data, and are not saved (see Restore).
	HostFunctions []string
	// Files counts the working directory's entries saved (files, directories, symbolic
	// links): an isolated namespace's with local workers; 0 otherwise.
	Files int
	// SandboxFiles counts the entries saved from the rest of the sandbox's writable layer:
	// its /tmp, /dev/shm and root (absolute names: Namespace.WriteFile), for a namespace
	// with a sandbox of its own; 0 otherwise. Restore writes them back into such a
	// namespace's sandbox.
	SandboxFiles int
}

var (
	stateKeyMu sync.Mutex
	stateKey   []byte
)

// SetStateKey sets the key that authenticates saved namespaces (Namespace.Save and
// Restore; HMAC-SHA256), at least 16 bytes. By default each process makes a random key of
// its own as it first needs one, so a namespace saved by one process can be restored by
// that process only; processes that restore each other's (replicas sharing a state
// directory) set the same secret key. It applies to later calls of Save and Restore.
func SetStateKey(key []byte) error {
	if len(key) < 16 {
		return fmt.Errorf("minipy: SetStateKey: a key of %d bytes is too short (16 at least, 32 random bytes best)",
			len(key))
	}
	stateKeyMu.Lock()
	defer stateKeyMu.Unlock()
	stateKey = bytes.Clone(key)
	return nil
}

func currentStateKey() []byte {
	stateKeyMu.Lock()
	defer stateKeyMu.Unlock()
	if stateKey == nil {
		stateKey = make([]byte, 32)
		rand.Read(stateKey) //nolint:errcheck // crypto/rand.Read never fails (Go 1.24)
	}
	return stateKey
}

// Save writes the namespace's variables, and an isolated namespace's working-directory
// files (and with a sandbox of its own, what its code wrote in its /tmp, /dev/shm and root:
// SaveInfo.SandboxFiles), to w, in a form that Restore takes, in this process or another one with the same
// Python minor version and state key (SetStateKey). It waits for a run in progress. The
// files stream to w as they are read (the host holds the variables and 256 KiB of files);
// after an error, what was written to w is no saved namespace, and Restore refuses it.
//
// Values are pickled. What the namespace's cells made is saved by value: functions,
// lambdas and classes (with the namespace as their functions' globals, so a restored
// function sees the variables later cells bind), and instances of those classes. Modules
// are saved by name and imported again; numpy arrays, pandas frames and other library
// values are pickled as their libraries say. Values that cannot be pickled (generators,
// open files, sockets, locks, threads) are skipped, and SaveInfo names them and says why.
// Host functions are the host's: SaveInfo names them, and Restore leaves them to the host.
//
// Pickling runs the values' own code (__reduce__, __getstate__), as Get does: the isolated
// engine stops it after two minutes, as a run past its timeout is stopped (the worker
// kicked, then killed and rolled back), and Save returns an error matching ErrTimeout;
// every namespace operation is bounded so. The in-process engine has no such bound.
// Threads and child processes are not saved.
func (ns *Namespace) Save(w io.Writer) (SaveInfo, error) {
	v, err := ns.op(pyrt.OpSave)
	if err != nil {
		return SaveInfo{}, err
	}
	items, _ := v.([]any)
	if len(items) != 5 {
		return SaveInfo{}, fmt.Errorf("minipy: Save: the runtime's reply is malformed: %w", errNotProtocol)
	}
	vars, _ := items[0].([]byte)
	hdr := stateHeader{Engine: "in-process", Saved: stringItems(items[1]), Hosts: stringItems(items[3]),
		Skipped: map[string]string{}}
	hdr.Python, _ = items[4].(string)
	for _, s := range asList(items[2]) {
		pair := asList(s)
		if len(pair) == 2 {
			name, _ := pair[0].(string)
			why, _ := pair[1].(string)
			hdr.Skipped[name] = why
		}
	}
	if _, ok := ns.engine.(*Isolated); ok {
		hdr.Engine = "isolated"
	}
	js, err := json.Marshal(hdr)
	if err != nil {
		return SaveInfo{}, fmt.Errorf("minipy: Save: %w", err)
	}
	sw := newStateWriter(w)
	sw.frames('H', js) //nolint:errcheck // (sw.err, below)
	if root, _, err := ns.keeperRoot("save"); err == nil {
		fw := &frameWriter{sw: sw, kind: 'F'}
		hdr.Files, err = sandboxfs.Tar(root, fw)
		root.Close()
		if err == nil {
			err = fw.Flush()
		}
		if err != nil && sw.err == nil {
			return SaveInfo{}, fmt.Errorf("minipy: Save: the working directory: %w", err)
		}
	} else if !errors.Is(err, ErrNoFiles) {
		return SaveInfo{}, err
	}
	places, err := ns.savePlaces(sw)
	if err != nil && sw.err == nil {
		return SaveInfo{}, fmt.Errorf("minipy: Save: %w", err)
	}
	sw.frames('V', vars) //nolint:errcheck // (sw.err, below)
	sw.frame('E', nil)
	if sw.err != nil {
		return SaveInfo{}, fmt.Errorf("minipy: Save: %w", sw.err)
	}
	info := SaveInfo{Saved: hdr.Saved, HostFunctions: hdr.Hosts, Files: hdr.Files, SandboxFiles: places,
		Reasons: hdr.Skipped}
	for _, s := range asList(items[2]) {
		if pair := asList(s); len(pair) == 2 {
			name, _ := pair[0].(string)
			info.Skipped = append(info.Skipped, name)
		}
	}
	return info, nil
}

// Restore replaces the namespace's variables with those that Save wrote to r, and writes
// the saved files into an isolated namespace's working directory (replacing files of the
// same names), and those of the sandbox's other places into its sandbox, if it has one of
// its own (else they are left out). It waits for a run in progress.
//
// It streams: the files are written as r gives them, a piece (a frame) at a time, and the
// variables are loaded at the end. Each frame is checked under the state key (SetStateKey)
// before anything of it is used, and bound to those before it: a saved namespace is code
// to the unpickler, so one that another key sealed, or that was altered, gives an error
// matching ErrStateTag. Input that is not a saved namespace (empty, cut, foreign, a later
// format) gives an error matching ErrBadState; a namespace saved by another Python minor
// version, or whose values cannot be loaded here (a module that is not installed), one
// matching ErrBadState too. In all these cases the variables are unchanged; files before
// the damage may be written (the error says so), and a save whose variables do not load
// leaves its files written. Files saved from an isolated namespace cannot be restored into
// one without a working directory of its own (in-process, or Command workers): ErrNoFiles,
// the namespace unchanged. Saves of format 1 (minipy before format 2) are read whole, then
// checked.
//
// Host functions registered on the namespace stay. A saved host function that is not
// registered on it is bound to a stand-in that raises minipy.HostError when called,
// saying so: register host functions again after Restore (before it works too).
//
// A namespace saved by an isolated engine is refused by one of the in-process engine
// (ErrUntrustedState): the code that made its values ran in a sandbox, and unpickling
// them would run it in the host process. RestoreTrusted says otherwise, by name.
func (ns *Namespace) Restore(r io.Reader) error { return ns.restore(r, restoreAll) }

// RestoreTrusted is Restore, but it also restores into an in-process namespace a namespace
// that an isolated engine saved: its values then run code of the sandboxed code's making
// in this process as they load. Use it only for states whose code you would run yourself.
func (ns *Namespace) RestoreTrusted(r io.Reader) error { return ns.restore(r, restoreTrusted) }

// RestoreFiles restores the files of a saved namespace alone: its working directory's
// files are written, as Restore writes them, and its variables are left as they are (a
// machine booted again from its disk, not from its memory: E2B's filesystem-only resume).
// The whole save is read and checked as Restore checks it, with the same errors (a save
// altered anywhere, its variables too, writes nothing past the damage), but its variables
// are never loaded: no value of the save's making is unpickled, in any engine.
func (ns *Namespace) RestoreFiles(r io.Reader) error { return ns.restore(r, restoreFilesOnly) }

// What a restore takes of a save.
type restoreMode int

const (
	restoreAll       restoreMode = iota // the variables and files (Restore)
	restoreTrusted                      // the same, an isolated engine's into an in-process namespace too (RestoreTrusted)
	restoreFilesOnly                    // the files alone (RestoreFiles)
)

func (ns *Namespace) restore(r io.Reader, mode restoreMode) error {
	trusted := mode != restoreAll
	ns.mu.Lock()
	err := ns.usable()
	ns.mu.Unlock()
	if err != nil {
		return err
	}
	br := bufio.NewReaderSize(r, 64<<10)
	if head, _ := br.Peek(len(stateMagic) + 2); len(head) == len(stateMagic)+2 && string(head[:len(stateMagic)]) == stateMagic && binary.LittleEndian.Uint16(head[len(stateMagic):]) == stateFormat {
		br.Discard(len(head)) //nolint:errcheck // (peeked)
		return ns.restoreFrames(&stateReader{r: br, chain: newStateChain(stateFormat)}, mode)
	}
	blob, err := io.ReadAll(br) // (format 1, or not a saved namespace: openState says which)
	if err != nil {
		return fmt.Errorf("minipy: Restore: reading: %w", err)
	}
	hdr, vars, files, err := openState(blob)
	if err != nil {
		return err
	}
	if err := ns.mayRestore(hdr, trusted); err != nil {
		return err
	}
	var root *sandboxfs.Root
	if hdr.Files > 0 {
		if root, _, err = ns.keeperRoot("restore"); err != nil {
			return fmt.Errorf("minipy: Restore: the saved namespace holds %d files: %w", hdr.Files, err)
		}
		defer root.Close()
	}
	if mode == restoreFilesOnly {
		if root == nil {
			return nil
		}
		return sandboxfs.Untar(root, bytes.NewReader(files))
	}
	hosts := make([]any, len(hdr.Hosts))
	for i, h := range hdr.Hosts {
		hosts[i] = h
	}
	_, err = ns.op(pyrt.OpRestore, vars, hosts, hdr.Python)
	if root == nil {
		return err
	}
	if errors.Is(err, ErrBadState) {
		// The variables may need the files: a module the code wrote, a package %pip
		// installed into the namespace's site (.local). Written first, then once more.
		if ferr := sandboxfs.Untar(root, bytes.NewReader(files)); ferr != nil {
			return err
		}
		if _, err := ns.op(pyrt.OpRestore, vars, hosts, hdr.Python); err != nil {
			return fmt.Errorf("%w (the saved files are written in the working directory)", err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if err := sandboxfs.Untar(root, bytes.NewReader(files)); err != nil {
		return fmt.Errorf("minipy: Restore: the variables are restored, but not all files: %w", err)
	}
	return nil
}

// mayRestore refuses a saved namespace an isolated engine made, into an in-process one,
// unless trusted (RestoreTrusted).
func (ns *Namespace) mayRestore(hdr stateHeader, trusted bool) error {
	if _, isolated := ns.engine.(*Isolated); hdr.Engine != "in-process" && !isolated && !trusted {
		return ErrUntrustedState
	}
	return nil
}

// restoreFrames restores a saved namespace of format 2 as sr reads it: its header, then its
// files, written into the working directory as they come, then its variables, loaded once
// the frames have ended where they should. Nothing of a frame is used before its tag
// matches; a save cut short or altered in its files leaves the files before that point
// written, and the variables as they were.
func (ns *Namespace) restoreFrames(sr *stateReader, mode restoreMode) error {
	filesOnly := mode == restoreFilesOnly
	bad := func(why string) error { return fmt.Errorf("%w: %s", ErrBadState, why) }
	f, err := sr.next()
	if err == io.EOF {
		return errStateCut("the header")
	}
	if err != nil {
		return err
	}
	var hdr stateHeader
	if f.kind != 'H' {
		return bad(fmt.Sprintf("a frame %q first, not the header", f.kind))
	}
	if err := json.Unmarshal(f.data, &hdr); err != nil {
		return bad("the header: " + err.Error())
	}
	if err := ns.mayRestore(hdr, mode != restoreAll); err != nil {
		return err
	}
	hosts := make([]any, len(hdr.Hosts))
	for i, h := range hdr.Hosts {
		hosts[i] = h
	}
	// The Python that saved it, before a file is written (no variables: only that; the
	// files alone load in any Python).
	if !filesOnly {
		if _, err := ns.op(pyrt.OpRestore, nil, hosts, hdr.Python); err != nil {
			return err
		}
	}
	wrote, err := ns.restoreFiles(sr)
	if err != nil {
		return err
	}
	wrotePlaces, err := ns.restorePlaces(sr)
	if err != nil {
		return err
	}
	wrote = wrote || wrotePlaces
	var vars []byte
	for sawVars := false; ; sawVars = true {
		kind, err := sr.peek()
		if err != nil {
			return err
		}
		if kind != 'V' {
			if !sawVars {
				return bad(fmt.Sprintf("a frame %q where the variables should be", kind))
			}
			break
		}
		f, _ := sr.next()
		if !filesOnly { // (checked all the same, never kept)
			vars = append(vars, f.data...)
		}
	}
	if f, err = sr.next(); err == io.EOF {
		return errStateCut("its end")
	} else if err != nil {
		return err
	}
	if f.kind != 'E' || len(f.data) > 0 {
		return bad(fmt.Sprintf("a frame %q where its end should be", f.kind))
	}
	if _, err := sr.r.ReadByte(); err != io.EOF {
		return bad("bytes after its end")
	}
	if filesOnly {
		return nil
	}
	if _, err := ns.op(pyrt.OpRestore, vars, hosts, hdr.Python); err != nil {
		if wrote {
			return fmt.Errorf("%w (the saved files are written in the working directory)", err)
		}
		return err
	}
	return nil
}

// restoreFiles writes the files' frames that sr reads next (none: nothing) into the
// working directory, and says whether it wrote any.
func (ns *Namespace) restoreFiles(sr *stateReader) (bool, error) {
	if kind, err := sr.peek(); err != nil || kind != 'F' {
		return false, err
	}
	var root *sandboxfs.Root
	open := func() (*sandboxfs.Root, error) {
		var err error
		if root, _, err = ns.keeperRoot("restore"); err != nil {
			return nil, fmt.Errorf("minipy: Restore: the saved namespace holds files: %w", err)
		}
		return root, nil
	}
	fr := &frameReader{sr: sr, kind: 'F'}
	err := sandboxfs.UntarInto(open, fr)
	if err == nil {
		_, err = io.Copy(io.Discard, fr) // (the archive's padding)
	}
	if root != nil {
		root.Close()
	}
	if err != nil && root != nil {
		return true, fmt.Errorf("minipy: Restore: not all files are written: %w", err)
	}
	return root != nil, err
}

// openState checks a saved namespace's magic, format, layout and tag, and returns its
// sections. Nothing of it is interpreted before its tag matches but the lengths that say
// where its sections end, so that a cut one is told apart from a forged one.
func openState(blob []byte) (hdr stateHeader, vars, files []byte, err error) {
	bad := func(why string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadState, fmt.Sprintf(why, args...))
	}
	if len(blob) == 0 {
		return hdr, nil, nil, bad("no bytes")
	}
	if len(blob) < len(stateMagic)+2 || string(blob[:len(stateMagic)]) != stateMagic {
		return hdr, nil, nil, bad("not a saved namespace (%d bytes that do not start as one)", len(blob))
	}
	if v := binary.LittleEndian.Uint16(blob[len(stateMagic):]); v != stateFormatV1 {
		return hdr, nil, nil, bad("format %d; this minipy reads formats %d and %d", v, stateFormatV1, stateFormat)
	}
	if len(blob) < len(stateMagic)+2+stateTagLen {
		return hdr, nil, nil, bad("cut short (%d bytes)", len(blob))
	}
	body, tag := blob[:len(blob)-stateTagLen], blob[len(blob)-stateTagLen:]
	sections := map[byte][]byte{}
	for rest := body[len(stateMagic)+2:]; len(rest) > 0; {
		if len(rest) < 9 || binary.LittleEndian.Uint64(rest[1:]) > uint64(len(rest)-9) {
			return hdr, nil, nil, bad("cut short, or with bytes added (%d bytes)", len(blob))
		}
		n := binary.LittleEndian.Uint64(rest[1:])
		sections[rest[0]] = rest[9 : 9+n]
		rest = rest[9+n:]
	}
	mac := hmac.New(sha256.New, currentStateKey())
	mac.Write(body)
	if !hmac.Equal(mac.Sum(nil), tag) {
		return hdr, nil, nil, ErrStateTag
	}
	for kind := range sections {
		if kind != 'H' && kind != 'V' && kind != 'F' {
			return hdr, nil, nil, bad("an unknown section %q", kind)
		}
	}
	if sections['H'] == nil || sections['V'] == nil {
		return hdr, nil, nil, bad("the header or the variables are missing")
	}
	if err := json.Unmarshal(sections['H'], &hdr); err != nil {
		return hdr, nil, nil, bad("the header: %v", err)
	}
	return hdr, sections['V'], sections['F'], nil
}

// stringItems is the strings of list v.
func stringItems(v any) []string {
	var out []string
	for _, item := range asList(v) {
		if s, ok := item.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}
