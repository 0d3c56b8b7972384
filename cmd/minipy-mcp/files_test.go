package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/mcpfront"
)

// The files a run makes come back as resource links after its text; resources/list and
// resources/read serve the session's files, and only to that session.
func TestFileResources(t *testing.T) {
	iso, err := minipy.NewIsolated(minipy.IsolatedConfig{})
	require.NoError(t, err)
	defer iso.Close()
	server := mcpfront.New(mcpfront.Config{Engine: iso, MaxResourceSize: 4096}).Server()
	a, b := connectInProcess(t, server), connectInProcess(t, server)
	require.NotNil(t, a.InitializeResult().Capabilities.Resources, "the server offers resources")
	ctx := context.Background()

	res := callContent(t, a, map[string]any{"code": `import os
os.makedirs("out", exist_ok=True)
open("out/report.txt", "w").write("north 150\n")
open("chart.png", "wb").write(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
open("big.csv", "w").write("x" * 5000)
print("done")`})
	require.False(t, res.IsError)
	require.Len(t, res.Content, 4)
	assert.Equal(t, "[stdout]\ndone\n", res.Content[0].(*mcp.TextContent).Text)
	var links []string
	for _, c := range res.Content[1:] {
		link, ok := c.(*mcp.ResourceLink)
		require.True(t, ok, "%T", c)
		links = append(links, fmt.Sprintf("%s %s %s %d", link.URI, link.Name, link.MIMEType, *link.Size))
	}
	assert.Equal(t, []string{
		"minipy://files/big.csv big.csv text/csv 5000",
		"minipy://files/chart.png chart.png image/png 264",
		"minipy://files/out/report.txt out/report.txt text/plain 10",
	}, links)

	list, err := a.ListResources(ctx, nil)
	require.NoError(t, err)
	var names []string
	for _, r := range list.Resources {
		names = append(names, r.Name)
	}
	assert.Equal(t, []string{"big.csv", "chart.png", "out/report.txt"}, names)

	read, err := a.ReadResource(ctx, &mcp.ReadResourceParams{URI: "minipy://files/out/report.txt"})
	require.NoError(t, err)
	require.Len(t, read.Contents, 1)
	assert.Equal(t, "north 150\n", read.Contents[0].Text)
	assert.Equal(t, "text/plain", read.Contents[0].MIMEType)
	read, err = a.ReadResource(ctx, &mcp.ReadResourceParams{URI: "minipy://files/chart.png"})
	require.NoError(t, err)
	assert.Equal(t, "image/png", read.Contents[0].MIMEType)
	assert.Len(t, read.Contents[0].Blob, 264, "binary files come as blobs")
	assert.Empty(t, read.Contents[0].Text)
	_, err = a.ReadResource(ctx, &mcp.ReadResourceParams{URI: "minipy://files/big.csv"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "-max-resource-size", "the cap is named")
	for _, uri := range []string{"minipy://files/nope.txt", "minipy://files/../etc/passwd", "minipy://files/%2e%2e/x",
		"file:///etc/passwd"} {
		_, err = a.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		assert.Error(t, err, uri)
	}

	// Any name the code can make: the link's URI reads it.
	res = callContent(t, a, map[string]any{"code": `open("été 100% #1?.txt", "w").write("odd")`})
	require.Len(t, res.Content, 2)
	odd := res.Content[1].(*mcp.ResourceLink)
	assert.Equal(t, "été 100% #1?.txt", odd.Name)
	read, err = a.ReadResource(ctx, &mcp.ReadResourceParams{URI: odd.URI})
	require.NoError(t, err, odd.URI)
	assert.Equal(t, "odd", read.Contents[0].Text)
	text, _ := run(t, a, map[string]any{"code": "import os; os.remove('été 100% #1?.txt')"})
	require.Equal(t, "[no output]\n", text)

	// B has files of its own: none of A's.
	list, err = b.ListResources(ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, list.Resources)
	_, err = b.ReadResource(ctx, &mcp.ReadResourceParams{URI: "minipy://files/out/report.txt"})
	assert.Error(t, err, "A's file is not B's to read")
	res = callContent(t, b, map[string]any{"code": "x = 1"})
	assert.Len(t, res.Content, 1, "a run that writes nothing links nothing")

	// Pages of 200, in name order, to the end.
	res = callContent(t, a, map[string]any{"code": "for i in range(250): open('many_%03d.txt' % i, 'w').write('m')"})
	assert.Len(t, res.Content, 1+minipy.MaxResultFiles)
	assert.Contains(t, res.Content[0].(*mcp.TextContent).Text, "150 more changed files are not linked")
	var all []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 5)
		list, err := a.ListResources(ctx, &mcp.ListResourcesParams{Cursor: cursor})
		require.NoError(t, err)
		for _, r := range list.Resources {
			all = append(all, r.Name)
		}
		if cursor = list.NextCursor; cursor == "" {
			break
		}
	}
	require.Len(t, all, 253)
	assert.Equal(t, "many_000.txt", all[2])
	assert.Equal(t, "out/report.txt", all[252])
	assert.IsIncreasing(t, all)

	// Reset empties the files too.
	text, _ = call(t, a, mcpfront.ResetToolName, map[string]any{})
	assert.Contains(t, text, "file")
	callContent(t, a, map[string]any{"code": "1"})
	list, err = a.ListResources(ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, list.Resources)
}

// The in-process engine's code shares the server's files: no resources.
func TestFileResourcesInProcess(t *testing.T) {
	cs := connectInProcess(t, mcpfront.NewServer(minipy.InProcess(), &minipy.Options{}))
	assert.Nil(t, cs.InitializeResult().Capabilities.Resources)
}
