package mcpfront

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/minipy-go/minipy"
)

// A run whose files may not all be listed (Result.MoreFilesUnknown) says so, with no count.
func TestFileLinksUnknownMore(t *testing.T) {
	links, note := fileLinks(minipy.ToolResult{Files: []minipy.FileInfo{{Name: "a.txt", Size: 1}}, MoreFiles: minipy.MoreFilesUnknown})
	assert.Len(t, links, 1)
	assert.Equal(t, "[files: more changed files may not be linked; resources/list lists them]\n", note)
	_, note = fileLinks(minipy.ToolResult{MoreFiles: 3})
	assert.Equal(t, "[files: 3 more changed files are not linked; resources/list lists them]\n", note)
	_, note = fileLinks(minipy.ToolResult{})
	assert.Empty(t, note)
}
