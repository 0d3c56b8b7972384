package minipy_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// allocated is the bytes the process's Go heap allocated while f ran.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Save and Restore stream a working directory's files: the host holds a frame of them at a
// time, not the save (24 MiB of files went through 2 copies of them in the host's memory,
// and a pause held a third).
func TestSaveRestoreStreams(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := newNS(t, e)
	runState(t, e, ns, `import os
for i in range(3):
    with open("big%d.bin" % i, "wb") as f:
        f.write(os.urandom(8 << 20))
x = 42`)
	path := filepath.Join(t.TempDir(), "saved")
	out, err := os.Create(path)
	require.NoError(t, err)
	var info minipy.SaveInfo
	saving := allocated(func() { info, err = ns.Save(out) })
	require.NoError(t, err)
	require.NoError(t, out.Close())
	assert.Equal(t, 3, info.Files)
	assert.Less(t, saving, uint64(8<<20), "the Go heap allocated %d bytes to save 24 MiB of files", saving)

	target := newNS(t, e)
	in, err := os.Open(path)
	require.NoError(t, err)
	defer in.Close()
	restoring := allocated(func() { err = target.Restore(in) })
	require.NoError(t, err)
	assert.Less(t, restoring, uint64(8<<20), "the Go heap allocated %d bytes to restore 24 MiB of files", restoring)
	assert.Equal(t, "42", runState(t, e, target, "x"))
	t.Logf("the Go heap allocated %d bytes to save 24 MiB of files, %d to restore them (135 MB and 55 MB when "+
		"a save was held whole)", saving, restoring)
	for i := 0; i < 3; i++ {
		want, err := ns.ReadFile(fmt.Sprintf("big%d.bin", i))
		require.NoError(t, err)
		got, err := target.ReadFile(fmt.Sprintf("big%d.bin", i))
		require.NoError(t, err)
		require.Equal(t, sha256.Sum256(want), sha256.Sum256(got), "big%d.bin", i)
	}
}

// stateFrames splits a saved namespace (format 2) into its head and its frames, each with
// its tag, as they are on the wire.
func stateFrames(t *testing.T, saved []byte) (head []byte, frames [][]byte) {
	t.Helper()
	head, rest := saved[:10], saved[10:]
	require.Equal(t, uint16(2), binary.LittleEndian.Uint16(head[8:]), "format 2")
	for len(rest) > 0 {
		n := 5 + int(binary.LittleEndian.Uint32(rest[1:])) + sha256.Size
		frames, rest = append(frames, rest[:n]), rest[n:]
	}
	return head, frames
}

// A save's frames are each checked before they are used, and bound to those before them:
// frames moved, dropped or cut, a frame too long, or bytes after the end are refused, the
// variables unchanged; files before the damage may be written, and the error says so.
func TestRestoreRefusesDamagedFrames(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	src := newNS(t, e)
	runState(t, e, src, "import os\nopen('data.bin', 'wb').write(os.urandom(900 << 10))\nx = 2")
	var saved bytes.Buffer
	_, err := src.Save(&saved)
	require.NoError(t, err)
	head, frames := stateFrames(t, saved.Bytes())
	kinds := ""
	for _, f := range frames {
		kinds += string(f[0])
	}
	require.Equal(t, "HFFFFVE", kinds, "the header, 900 KiB of files in frames of 256 KiB, the variables, the end")
	join := func(parts ...[]byte) []byte { return bytes.Join(append([][]byte{head}, parts...), nil) }
	all := func() [][]byte { return append([][]byte(nil), frames...) }
	swapped := all()
	swapped[1], swapped[2] = swapped[2], swapped[1]
	dropped := append(all()[:2], frames[3:]...)
	long := bytes.Clone(frames[5])
	binary.LittleEndian.PutUint32(long[1:], 64<<20)
	whole := saved.Bytes()
	for what, c := range map[string]struct {
		input []byte
		want  error
	}{
		"files moved":       {join(swapped...), minipy.ErrStateTag},
		"files dropped":     {join(dropped...), minipy.ErrStateTag},
		"cut in the files":  {whole[:len(head)+len(frames[0])+len(frames[1])+100], minipy.ErrBadState},
		"cut before E":      {whole[:len(whole)-len(frames[6])], minipy.ErrBadState},
		"variables dropped": {join(append(all()[:5], frames[6])...), minipy.ErrStateTag},
		"a frame too long":  {join(append(all()[:5], long)...), minipy.ErrBadState},
		"bytes after E":     {append(bytes.Clone(whole), 'E'), minipy.ErrBadState},
	} {
		t.Run(what, func(t *testing.T) {
			ns := newNS(t, e)
			runState(t, e, ns, "x = 1")
			err := ns.Restore(bytes.NewReader(c.input))
			require.ErrorIs(t, err, c.want)
			assert.Equal(t, "1", runState(t, e, ns, "x"), "the variables are unchanged")
		})
	}
	ns := newNS(t, e)
	require.NoError(t, ns.Restore(bytes.NewReader(whole)))
	assert.Equal(t, "(2, 921600)", runState(t, e, ns, "x, os.path.getsize('data.bin')"))
}

// RestoreFiles writes a save's files and leaves the variables as they are (E2B's
// filesystem-only resume), checking the whole save as Restore does.
func TestRestoreFiles(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	src := newNS(t, e)
	runState(t, e, src, "import os\nos.makedirs('d', exist_ok=True)\nopen('d/a.txt', 'w').write('kept')\nx = 2")
	var saved bytes.Buffer
	_, err := src.Save(&saved)
	require.NoError(t, err)

	ns := newNS(t, e)
	runState(t, e, ns, "y = 1")
	require.NoError(t, ns.RestoreFiles(bytes.NewReader(saved.Bytes())))
	assert.Equal(t, "('kept', False, 1)", runState(t, e, ns, "open('d/a.txt').read(), 'x' in globals(), y"),
		"the files are written, the saved variables are not loaded, the namespace's own stay")

	head, frames := stateFrames(t, saved.Bytes())
	n := len(frames)
	require.Equal(t, byte('V'), frames[n-2][0])
	flipped := bytes.Clone(frames[n-2])
	flipped[len(flipped)-1] ^= 1
	damaged := bytes.Join(append(append([][]byte{head}, frames[:n-2]...), flipped, frames[n-1]), nil)
	other := newNS(t, e)
	require.ErrorIs(t, other.RestoreFiles(bytes.NewReader(damaged)), minipy.ErrStateTag,
		"variables altered: the save is refused though they would not be loaded")
	require.ErrorIs(t, other.RestoreFiles(bytes.NewReader([]byte("not a save"))), minipy.ErrBadState)
}
