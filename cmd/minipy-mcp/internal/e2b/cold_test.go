package e2b

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A pause that keeps no memory (E2B's pause({keepMemory: false}), or the lifecycle's
// onTimeout with keepMemory false) resumes as a new boot: the files are back, the
// variables are not, the execution count starts again and the boot id is another. A pause
// that keeps the memory keeps the variables; both keep the files. In the server's memory
// and through a store alike.
func TestColdPause(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		_, base := pauseServer(t, Config{Authenticate: func(key string) (string, bool) { return key, key != "" }})
		coldPause(t, base)
	})
	t.Run("store", func(t *testing.T) {
		_, base := storeServer(t, t.TempDir(), Config{})
		coldPause(t, base)
	})
}

const bootID = `open("/proc/sys/kernel/random/boot_id").read().strip()`

func coldPause(t *testing.T, base string) {
	code, sb := callAs(t, "ann", "POST", base+"/v2/sandboxes", `{}`)
	require.Equal(t, http.StatusCreated, code, "%v", sb)
	id := sb["sandboxID"].(string)
	require.Equal(t, "", run(t, base, sb, "x = 41\nn = open('f.txt', 'w').write('hi')"))
	boot := run(t, base, sb, bootID)
	require.Len(t, boot, 36)

	code, body := callAs(t, "ann", "POST", base+"/sandboxes/"+id+"/pause", `{"memory": true}`)
	require.Equal(t, http.StatusNoContent, code, "%v", body)
	code, _ = callAs(t, "ann", "POST", base+"/v2/sandboxes/"+id+"/connect", `{"timeout": 60}`)
	require.Equal(t, http.StatusCreated, code)
	assert.Equal(t, "(41, 'hi')", run(t, base, sb, "x, open('f.txt').read()"), "a pause with its memory keeps the variables")

	code, body = callAs(t, "ann", "POST", base+"/sandboxes/"+id+"/pause", `{"memory": false}`)
	require.Equal(t, http.StatusNoContent, code, "%v", body)
	code, _ = callAs(t, "ann", "POST", base+"/v2/sandboxes/"+id+"/connect", `{"timeout": 60}`)
	require.Equal(t, http.StatusCreated, code)
	assert.Equal(t, "(False, 'hi')", run(t, base, sb, "'x' in globals(), open('f.txt').read()"),
		"a new boot: the files, not the variables")
	after := run(t, base, sb, bootID)
	assert.Len(t, after, 36)
	assert.NotEqual(t, boot, after, "a new boot id")

	// The lifecycle's onTimeout: pause with keepMemory false.
	code, sb = callAs(t, "ann", "POST", base+"/v2/sandboxes", `{"timeout": 1, "autoPause": true, "autoPauseMemory": false}`)
	require.Equal(t, http.StatusCreated, code, "%v", sb)
	id = sb["sandboxID"].(string)
	require.Equal(t, "", run(t, base, sb, "y = 1\nn = open('g.txt', 'w').write('there')"))
	require.Eventually(t, func() bool {
		_, info := callAs(t, "ann", "GET", base+"/sandboxes/"+id, "")
		return info["state"] == "paused"
	}, 20*time.Second, 20*time.Millisecond)
	code, _ = callAs(t, "ann", "POST", base+"/v2/sandboxes/"+id+"/connect", `{"timeout": 60}`)
	require.Equal(t, http.StatusCreated, code)
	assert.Equal(t, "(False, 'there')", run(t, base, sb, "'y' in globals(), open('g.txt').read()"))

	code, _ = callAs(t, "ann", "POST", base+"/sandboxes/"+id+"/pause", `{"memory": "yes"}`)
	assert.Equal(t, http.StatusBadRequest, code, "a body that is not E2B's")
	assert.False(t, strings.HasPrefix(run(t, base, sb, "1"), "HTTP"), "and it goes on running")
}
