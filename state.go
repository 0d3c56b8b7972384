package minipy

import (
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
)

// Saving and restoring a namespace (docs/state.md has the format). A saved namespace is:
//
//	"minipyNS"          8 bytes, the magic
//	u16                 the format's version (stateFormat)
//	sections            each a kind byte, a u64 length and that many bytes:
//	                    'H' the header (JSON, stateHeader), first;
//	                    'V' the variables (a pickle, internal/pyrt/state.py);
//	                    'F' the working directory's files (a tar archive), if any
//	tag                 32 bytes: HMAC-SHA256 of everything before it, under the state key
//
// All integers are little-endian.

const (
	stateMagic  = "minipyNS"
	stateFormat = 1
	stateTagLen = sha256.Size
)

// stateHeader is a saved namespace's header section.
type stateHeader struct {
	Python  string            `json:"python"` // major.minor of the Python that saved it
	Engine  string            `json:"engine"` // "in-process" or "isolated"
	Saved   []string          `json:"saved"`
	Skipped map[string]string `json:"skipped,omitempty"` // name -> why
	Hosts   []string          `json:"hosts,omitempty"`   // host functions' names
	Files   int               `json:"files"`             // entries of the files section
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
// files, to w, in a form that Restore takes, in this process or another one with the same
// Python minor version and state key (SetStateKey). It waits for a run in progress.
//
// Values are pickled. What the namespace's cells made is saved by value: functions,
// lambdas and classes (with the namespace as their functions' globals, so a restored
// function sees the variables later cells bind), and instances of those classes. Modules
// are saved by name and imported again; numpy arrays, pandas frames and other library
// values are pickled as their libraries say. Values that cannot be pickled (generators,
// open files, sockets, locks, threads) are skipped, and SaveInfo names them and says why.
// Host functions are the host's: SaveInfo names them, and Restore leaves them to the host.
//
// Pickling runs the values' own code (__reduce__, __getstate__) without a deadline, as
// Get does. Threads and child processes are not saved.
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
	var files bytes.Buffer
	if root, _, err := ns.fileRoot("save", ".", true); err == nil {
		hdr.Files, err = tarFiles(root, &files)
		root.close()
		if err != nil {
			return SaveInfo{}, fmt.Errorf("minipy: Save: the working directory: %w", err)
		}
	} else if !errors.Is(err, ErrNoFiles) {
		return SaveInfo{}, err
	}
	blob, err := sealState(hdr, vars, files.Bytes())
	if err != nil {
		return SaveInfo{}, err
	}
	if _, err := w.Write(blob); err != nil {
		return SaveInfo{}, fmt.Errorf("minipy: Save: %w", err)
	}
	info := SaveInfo{Saved: hdr.Saved, HostFunctions: hdr.Hosts, Files: hdr.Files, Reasons: hdr.Skipped}
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
// same names). It waits for a run in progress.
//
// It first reads r to its end and checks the saved namespace's tag under the state key
// (SetStateKey): a saved namespace is code to the unpickler, so one that another key
// sealed, or that was altered, gives an error matching ErrStateTag and nothing of it is
// run. Input that is not a saved namespace (empty, truncated, foreign, a later format)
// gives an error matching ErrBadState; a namespace saved by another Python minor version,
// or whose values cannot be loaded here (a module that is not installed), one matching
// ErrBadState too. In all these cases the namespace is unchanged, but for one: values that
// cannot be loaded before the saved files are there (a module the code wrote, a package
// %pip installed in the namespace's site) are loaded again once the files are written, and
// when that fails too the files stay written. Files saved from an
// isolated namespace cannot be restored into one without a working directory of its own
// (in-process, or Command workers): ErrNoFiles, the namespace unchanged.
//
// Host functions registered on the namespace stay. A saved host function that is not
// registered on it is bound to a stand-in that raises minipy.HostError when called,
// saying so: register host functions again after Restore (before it works too).
//
// A namespace saved by an isolated engine is refused by one of the in-process engine
// (ErrUntrustedState): the code that made its values ran in a sandbox, and unpickling
// them would run it in the host process. RestoreTrusted says otherwise, by name.
func (ns *Namespace) Restore(r io.Reader) error { return ns.restore(r, false) }

// RestoreTrusted is Restore, but it also restores into an in-process namespace a namespace
// that an isolated engine saved: its values then run code of the sandboxed code's making
// in this process as they load. Use it only for states whose code you would run yourself.
func (ns *Namespace) RestoreTrusted(r io.Reader) error { return ns.restore(r, true) }

func (ns *Namespace) restore(r io.Reader, trusted bool) error {
	ns.mu.Lock()
	err := ns.usable()
	ns.mu.Unlock()
	if err != nil {
		return err
	}
	blob, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("minipy: Restore: reading: %w", err)
	}
	hdr, vars, files, err := openState(blob)
	if err != nil {
		return err
	}
	if _, isolated := ns.engine.(*Isolated); hdr.Engine != "in-process" && !isolated && !trusted {
		return ErrUntrustedState
	}
	var root *workRoot
	if hdr.Files > 0 {
		if root, _, err = ns.fileRoot("restore", ".", true); err != nil {
			return fmt.Errorf("minipy: Restore: the saved namespace holds %d files: %w", hdr.Files, err)
		}
		defer root.close()
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
		if ferr := untarFiles(root, bytes.NewReader(files)); ferr != nil {
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
	if err := untarFiles(root, bytes.NewReader(files)); err != nil {
		return fmt.Errorf("minipy: Restore: the variables are restored, but not all files: %w", err)
	}
	return nil
}

// sealState lays out a saved namespace and seals it with its tag.
func sealState(hdr stateHeader, vars, files []byte) ([]byte, error) {
	js, err := json.Marshal(hdr)
	if err != nil {
		return nil, fmt.Errorf("minipy: Save: %w", err)
	}
	b := make([]byte, 0, len(stateMagic)+2+3*9+len(js)+len(vars)+len(files)+stateTagLen)
	b = append(b, stateMagic...)
	b = binary.LittleEndian.AppendUint16(b, stateFormat)
	section := func(kind byte, data []byte) {
		b = append(b, kind)
		b = binary.LittleEndian.AppendUint64(b, uint64(len(data)))
		b = append(b, data...)
	}
	section('H', js)
	section('V', vars)
	if len(files) > 0 {
		section('F', files)
	}
	mac := hmac.New(sha256.New, currentStateKey())
	mac.Write(b)
	return mac.Sum(b), nil
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
	if v := binary.LittleEndian.Uint16(blob[len(stateMagic):]); v != stateFormat {
		return hdr, nil, nil, bad("format %d; this minipy reads format %d", v, stateFormat)
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
