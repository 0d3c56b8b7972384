package loopguard

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost": true, "LOCALHOST:8080": true, "localhost.": true, "49999-abc.localhost:3000": true,
		"127.0.0.1": true, "127.0.0.2:80": true, "[::1]:80": true, "::1": true, "[::ffff:127.0.0.1]:80": true,
		"attacker.example": false, "localhost.attacker.example": false, "127.0.0.1.nip.io": false, "": false,
		"10.0.0.1:80": false, "0.0.0.0": false, "[::]:80": false,
	} {
		assert.Equal(t, want, LoopbackHost(host), host)
	}
}

func TestCheck(t *testing.T) {
	request := func(local, host, origin string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "http://x/", nil)
		r.Host = host
		if origin != "" {
			r.Header.Set("Origin", origin)
		}
		addr, _ := net.ResolveTCPAddr("tcp", local)
		return r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, addr))
	}
	for _, c := range []struct {
		local, host, origin string
		anonymous           bool
		want                error
	}{
		{"127.0.0.1:80", "127.0.0.1:80", "", true, nil},
		{"127.0.0.1:80", "localhost:80", "http://localhost:5173", true, nil},
		{"127.0.0.1:80", "evil.example:80", "", false, ErrHost}, // (tokens or not)
		{"127.0.0.1:80", "evil.example:80", "", true, ErrHost},
		{"127.0.0.1:80", "127.0.0.1:80", "http://evil.example", true, ErrOrigin},
		{"127.0.0.1:80", "127.0.0.1:80", "null", true, ErrOrigin},
		{"127.0.0.1:80", "127.0.0.1:80", "file://", true, ErrOrigin},
		{"127.0.0.1:80", "127.0.0.1:80", "http://evil.example", false, nil},  // (a browser app with a token)
		{"10.1.2.3:80", "evil.example:80", "http://evil.example", true, nil}, // (beyond loopback: -allow-anonymous)
	} {
		err := Check(request(c.local, c.host, c.origin), c.anonymous)
		if c.want == nil {
			assert.NoError(t, err, "%+v", c)
		} else {
			assert.ErrorIs(t, err, c.want, "%+v", c)
		}
	}
	long := make([]byte, 1<<16)
	for i := range long {
		long[i] = 'a'
	}
	err := Check(request("127.0.0.1:80", string(long), ""), true)
	assert.ErrorIs(t, err, ErrHost)
	assert.Less(t, len(err.Error()), 300, "a refusal repeats a bounded part of what it refused")
}
