package e2b

import (
	"context"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b/envd/proto/filesystem"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b/envd/proto/filesystem/filesystemconnect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// envd's watchers: WatchDir streams a directory's changes (with entries if asked), the
// polled watchers keep them for GetWatcherEvents until removed; a missing directory is
// NotFound, a file InvalidArgument; a sandbox has at most maxSandboxWatch.
func TestWatchers(t *testing.T) {
	_, base := pauseServer(t, Config{})
	code, sb := call(t, "POST", base+"/v2/sandboxes", `{}`)
	require.Equal(t, http.StatusCreated, code)
	id, token := sb["sandboxID"].(string), sb["envdAccessToken"].(string)
	client := filesystemconnect.NewFilesystemClient(&http.Client{Transport: toSandbox{id, token}}, base)
	ctx := context.Background()
	_, err := client.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: "/home/user/w"}))
	require.NoError(t, err)
	upload := func(p string) {
		code, _ := onPort(t, base, id, token, "49983", "POST", "/files?path="+p, "content")
		require.Equal(t, http.StatusOK, code)
	}

	wctx, cancel := context.WithCancel(ctx)
	stream, err := client.WatchDir(wctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: "/home/user/w",
		Recursive: true, IncludeEntry: true}))
	require.NoError(t, err)
	require.True(t, stream.Receive())
	require.NotNil(t, stream.Msg().GetStart())
	upload("w/a.txt")
	for {
		require.True(t, stream.Receive(), "%v", stream.Err())
		ev := stream.Msg().GetFilesystem()
		if ev.GetType() == filesystem.EventType_EVENT_TYPE_WRITE && ev.GetName() == "a.txt" {
			assert.Equal(t, "/home/user/w/a.txt", ev.GetEntry().GetPath())
			assert.Equal(t, filesystem.FileType_FILE_TYPE_FILE, ev.GetEntry().GetType())
			break
		}
	}
	cancel()

	made, err := client.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "/home/user/w"}))
	require.NoError(t, err)
	wid := made.Msg.GetWatcherId()
	upload("w/b.txt")
	require.Eventually(t, func() bool {
		got, err := client.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: wid}))
		require.NoError(t, err)
		for _, ev := range got.Msg.GetEvents() {
			if ev.GetName() == "b.txt" && ev.GetType() == filesystem.EventType_EVENT_TYPE_CREATE {
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond)
	_, err = client.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: wid}))
	require.NoError(t, err)
	_, err = client.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: wid}))
	assert.Equal(t, connect.CodeNotFound, connect.CodeOf(err))

	_, err = client.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "/home/user/none"}))
	assert.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = client.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "/home/user/w/a.txt"}))
	assert.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.Eventually(t, func() bool { // (the stream's watch gives its place back as it ends)
		var ids []string
		defer func() {
			for _, one := range ids {
				client.RemoveWatcher(ctx, connect.NewRequest(&filesystem.RemoveWatcherRequest{WatcherId: one})) //nolint:errcheck
			}
		}()
		for range maxSandboxWatch {
			made, err := client.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "/home/user/w"}))
			if err != nil {
				return false
			}
			ids = append(ids, made.Msg.GetWatcherId())
		}
		_, err := client.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "/home/user/w"}))
		return connect.CodeOf(err) == connect.CodeResourceExhausted
	}, 10*time.Second, 50*time.Millisecond, "at most maxSandboxWatch")
}
