package minipy

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
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
	hdr, vars, files, err := openState(saved.Bytes())
	require.NoError(t, err)
	hdr.Python = "3.9"
	blob, err := sealState(hdr, vars, files)
	require.NoError(t, err)

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
