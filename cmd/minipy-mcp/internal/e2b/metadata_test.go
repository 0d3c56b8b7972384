package e2b

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An upload's metadata: its X-Metadata-KEY headers, keys lower-cased; a value that is not
// printable ASCII is refused, and the file is not written.
func TestUploadMetadata(t *testing.T) {
	md, why := uploadMetadata(http.Header{"X-Metadata-Author": {"mish"}, "X-Metadata-Purpose": {"upload"}, "Other": {"x"}})
	assert.Empty(t, why)
	assert.Equal(t, map[string]string{"author": "mish", "purpose": "upload"}, md)
	md, why = uploadMetadata(http.Header{"Content-Type": {"text/plain"}})
	assert.Empty(t, why)
	assert.Nil(t, md)
	for _, bad := range []http.Header{{"X-Metadata-Good": {"bad\tvalue"}}, {"X-Metadata-Good": {"a", "b"}},
		{"X-Metadata-": {"v"}}, {"X-Metadata-Good": {"é"}}} {
		_, why = uploadMetadata(bad)
		assert.NotEmpty(t, why, "%v", bad)
	}

	_, base := pauseServer(t, Config{})
	code, sb := call(t, "POST", base+"/v2/sandboxes", `{}`)
	require.Equal(t, http.StatusCreated, code)
	req, err := http.NewRequest("POST", base+"/files?path=refused.txt", strings.NewReader("x"))
	require.NoError(t, err)
	req.Header.Set("E2b-Sandbox-Id", sb["sandboxID"].(string))
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", sb["envdAccessToken"].(string))
	req.Header.Set("X-Metadata-Good", "bad\tvalue")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	code, _ = onPort(t, base, sb["sandboxID"].(string), sb["envdAccessToken"].(string), "49983", "GET", "/files?path=refused.txt", "")
	assert.Equal(t, http.StatusNotFound, code, "not written")
}
