package minipy

import (
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An engine holds at most engineTerminals terminals open (the host's pseudo terminals are
// the whole machine's): past them a terminal command is refused, and closing one's Stdout
// gives its place back, as does a start that fails.
func TestTerminalsBounded(t *testing.T) {
	e, err := NewIsolated(IsolatedConfig{Spares: -1})
	require.NoError(t, err)
	defer e.Close()
	ns := e.NewNamespace()
	defer ns.Close()
	size := &TerminalSize{Rows: 24, Cols: 80}
	p, err := ns.Start(Command{Args: []string{"true"}, Terminal: size})
	require.NoError(t, err)
	assert.EqualValues(t, 1, e.terminals.Load())
	e.terminals.Add(engineTerminals - 1)
	_, err = ns.Start(Command{Args: []string{"true"}, Terminal: size})
	assert.ErrorIs(t, err, ErrTooManyTerminals)
	io.Copy(io.Discard, p.Stdout) //nolint:errcheck // (to its end)
	_, err = p.Wait()
	require.NoError(t, err)
	require.NoError(t, p.Stdout.Close())
	p.Stdout.Close() //nolint:errcheck // (closed already: it gives nothing back twice)
	assert.EqualValues(t, engineTerminals-1, e.terminals.Load())
	q, err := ns.Start(Command{Args: []string{"true"}, Terminal: size})
	require.NoError(t, err, "a place is free again")
	q.Stdout.Close()
	_, err = ns.Start(Command{Args: []string{"/no/such/program"}, Terminal: &TerminalSize{}})
	require.Error(t, err)
	assert.EqualValues(t, engineTerminals-1, e.terminals.Load(), "a failed start holds no place")
}
