package minipy

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRestoreOtherPythonVersion: a namespace saved by another Python minor version (its
// code objects are that version's) is refused, the namespace unchanged.
func TestRestoreOtherPythonVersion(t *testing.T) {
	src := NewNamespace()
	defer src.Close()
	require.NoError(t, src.Set("v", 1))
	var saved bytes.Buffer
	_, err := src.Save(&saved)
	require.NoError(t, err)
	frames := readFrames(t, saved.Bytes())
	var hdr stateHeader
	require.NoError(t, json.Unmarshal(frames[0].data, &hdr))
	hdr.Python = "3.9"
	frames[0].data, err = json.Marshal(hdr)
	require.NoError(t, err)
	blob := writeFrames(frames)

	ns := NewNamespace()
	defer ns.Close()
	require.NoError(t, ns.Set("kept", 2))
	err = ns.Restore(bytes.NewReader(blob))
	require.ErrorIs(t, err, ErrBadState)
	assert.Contains(t, err.Error(), "saved by Python 3.9")
	names, err := ns.Names()
	require.NoError(t, err)
	assert.Equal(t, []string{"kept"}, names)
}

// TestOpenStateSections: a sealed namespace with an unknown section (a later minipy's), or
// without its variables, is refused after its tag matched; empty variables are a section.
func TestOpenStateSections(t *testing.T) {
	seal := func(sections ...[]byte) []byte {
		b := append([]byte(stateMagic), 1, 0)
		for _, s := range sections {
			b = append(b, s[0])
			b = binary.LittleEndian.AppendUint64(b, uint64(len(s)-1))
			b = append(b, s[1:]...)
		}
		mac := hmac.New(sha256.New, currentStateKey())
		mac.Write(b)
		return mac.Sum(b)
	}
	_, vars, _, err := openState(seal([]byte(`H{"python":"3.13"}`), []byte("Vv")))
	require.NoError(t, err)
	assert.Equal(t, []byte("v"), vars)
	_, vars, _, err = openState(seal([]byte(`H{}`), []byte("V")))
	require.NoError(t, err)
	assert.Empty(t, vars)

	_, _, _, err = openState(seal([]byte(`H{}`), []byte("Vv"), []byte("Zz")))
	assert.ErrorIs(t, err, ErrBadState)
	assert.Contains(t, err.Error(), "unknown section 'Z'")
	_, _, _, err = openState(seal([]byte(`H{}`)))
	assert.ErrorIs(t, err, ErrBadState)
	_, _, _, err = openState(seal([]byte(`H{not json`), []byte("Vv")))
	assert.ErrorIs(t, err, ErrBadState)
}

// sealState lays out a saved namespace in format 1 (what minipy wrote before format 2)
// and seals it with its tag.
func sealState(hdr stateHeader, vars, files []byte) ([]byte, error) {
	js, err := json.Marshal(hdr)
	if err != nil {
		return nil, fmt.Errorf("minipy: Save: %w", err)
	}
	b := make([]byte, 0, len(stateMagic)+2+3*9+len(js)+len(vars)+len(files)+stateTagLen)
	b = append(b, stateMagic...)
	b = binary.LittleEndian.AppendUint16(b, stateFormatV1)
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

// readFrames is the frames of a saved namespace of format 2 (each checked).
func readFrames(t *testing.T, blob []byte) []stateFrame {
	t.Helper()
	require.Equal(t, stateMagic, string(blob[:len(stateMagic)]))
	sr := &stateReader{r: bufio.NewReader(bytes.NewReader(blob[len(stateMagic)+2:])), chain: newStateChain(stateFormat)}
	var frames []stateFrame
	for {
		f, err := sr.next()
		if err == io.EOF {
			return frames
		}
		require.NoError(t, err)
		frames = append(frames, stateFrame{f.kind, bytes.Clone(f.data)})
	}
}

// writeFrames seals frames as a saved namespace of format 2.
func writeFrames(frames []stateFrame) []byte {
	var b bytes.Buffer
	sw := newStateWriter(&b)
	for _, f := range frames {
		sw.frame(f.kind, f.data)
	}
	return b.Bytes()
}

// TestRestoreFormat1: a namespace saved in format 1 (what minipy wrote before the frames)
// is still restored; a cut one is refused, the namespace unchanged.
func TestRestoreFormat1(t *testing.T) {
	src := NewNamespace()
	defer src.Close()
	require.NoError(t, src.Set("v", []any{int64(1), "two"}))
	var saved bytes.Buffer
	_, err := src.Save(&saved)
	require.NoError(t, err)
	frames := readFrames(t, saved.Bytes())
	var hdr stateHeader
	require.NoError(t, json.Unmarshal(frames[0].data, &hdr))
	var vars []byte
	for _, f := range frames {
		if f.kind == 'V' {
			vars = append(vars, f.data...)
		}
	}
	old, err := sealState(hdr, vars, nil)
	require.NoError(t, err)

	ns := NewNamespace()
	defer ns.Close()
	require.NoError(t, ns.Set("kept", 2))
	require.ErrorIs(t, ns.Restore(bytes.NewReader(old[:len(old)-1])), ErrBadState)
	names, err := ns.Names()
	require.NoError(t, err)
	assert.Equal(t, []string{"kept"}, names)
	require.NoError(t, ns.Restore(bytes.NewReader(old)))
	v, err := ns.Get("v")
	require.NoError(t, err)
	assert.Equal(t, []any{int64(1), "two"}, v)
}
