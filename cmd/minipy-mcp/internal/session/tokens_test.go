package session

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTokens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(path, []byte("# users\nann:0123456789abcdef\nann:fedcba9876543210\n\nbob: bbbbbbbbbbbbbbbb\n"), 0o600))
	toks, err := LoadTokens(path)
	require.NoError(t, err)
	n, users := toks.Users()
	assert.Equal(t, 3, n)
	assert.Equal(t, 2, users)
	for token, want := range map[string]string{"0123456789abcdef": "ann", "fedcba9876543210": "ann", "bbbbbbbbbbbbbbbb": "bob"} {
		user, ok := toks.User(token)
		assert.True(t, ok, token)
		assert.Equal(t, want, user)
	}
	for _, token := range []string{"", "0123456789abcde", "0123456789abcdef0", "bob"} {
		_, ok := toks.User(token)
		assert.False(t, ok, token)
	}

	// A file that went bad leaves the tokens as they were.
	require.NoError(t, os.WriteFile(path, []byte("carl:short\n"), 0o600))
	_, err = toks.Reload()
	require.Error(t, err)
	_, ok := toks.User("bbbbbbbbbbbbbbbb")
	assert.True(t, ok)
	// Users left without a token are revoked: the reload names them, once each.
	require.NoError(t, os.WriteFile(path, []byte("carl:cccccccccccccccc\nann:0123456789abcdef\n"), 0o600))
	revoked, err := toks.Reload()
	require.NoError(t, err)
	assert.Equal(t, []string{"bob"}, revoked, "ann keeps one of her two tokens")
	_, ok = toks.User("bbbbbbbbbbbbbbbb")
	assert.False(t, ok, "dropped")
	assert.False(t, toks.Has("bob"))
	assert.True(t, toks.Has("ann"))
	assert.True(t, toks.Has("carl"))
}

// The errors name lines, never a token.
func TestTokenFileErrors(t *testing.T) {
	for text, want := range map[string]string{
		"":                        "no NAME:TOKEN line",
		"ann\n":                   "line 1 is not NAME:TOKEN",
		"an n:0123456789abcdef\n": "line 1: the name must be",
		"ann:secret\n":            "line 1: the token is shorter than 16",
		"ann:0123456789 abcdef\n": "line 1: the token holds a space",
		"ann:0123456789abcdef\nbob:0123456789abcdef": "lines 1 and 2 give the same token",
	} {
		_, err := parseTokens([]byte(text))
		require.Error(t, err, text)
		assert.Contains(t, err.Error(), want)
		assert.False(t, strings.Contains(err.Error(), "0123456789"), "no token in %q", err)
	}
}
