package sandboxfs

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// An engine's bound on watches leaves three quarters of the host user's budget to the rest.
func TestEngineWatches(t *testing.T) {
	assert.Equal(t, EngineWatchLimit, EngineWatches(192530))
	assert.Equal(t, 2048, EngineWatches(8192), "an old kernel's default")
	assert.Equal(t, 1, EngineWatches(1))
	assert.Equal(t, EngineWatchLimit, EngineWatches(-1), "unread")
}
