package main

// Code mode over other MCP servers: minipy-mcp connects to upstream servers as an MCP client
// and gives each of their tools to the model's Python code as a function, grouped by
// server (everything.echo(message="hi")). The model then loops over, filters and joins
// their results in code, and only what it prints comes back into its context.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/minipy-go/minipy"
)

// upstreamConfig is the usual MCP client configuration: Claude Desktop's
// claude_desktop_config.json, Cursor's mcp.json and most others' share this shape.
type upstreamConfig struct {
	MCPServers map[string]upstreamServer `json:"mcpServers"`
}

// upstreamServer is one entry of mcpServers: a command to start (stdio) or a URL.
type upstreamServer struct {
	Command  string            `json:"command"`
	Args     []string          `json:"args"`
	Env      map[string]string `json:"env"`
	Cwd      string            `json:"cwd"`
	URL      string            `json:"url"`
	Type     string            `json:"type"` // "stdio", "http" (Streamable HTTP, the default for a URL) or "sse"
	Headers  map[string]string `json:"headers"`
	Disabled bool              `json:"disabled"`
}

// upstreams is the connected upstream servers and their tools as host functions.
type upstreams struct {
	sessions  []*mcp.ClientSession
	functions []minipy.Function
}

// connectUpstreams reads an mcpServers file, connects to every server it names that is not
// disabled and lists their tools. Any failure is an error: a server that cannot be reached
// at start is a configuration mistake to report, not to hide.
func connectUpstreams(ctx context.Context, path string) (*upstreams, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var cfg upstreamConfig
	dec := json.NewDecoder(bytes.NewReader(raw))
	if err := dec.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(cfg.MCPServers) == 0 {
		return nil, fmt.Errorf("%s: no servers under \"mcpServers\"", path)
	}
	names := make([]string, 0, len(cfg.MCPServers))
	for name := range cfg.MCPServers {
		names = append(names, name)
	}
	sort.Strings(names)
	u := &upstreams{}
	groups := map[string]bool{}
	for _, name := range names {
		srv := cfg.MCPServers[name]
		if srv.Disabled {
			continue
		}
		cs, err := connectUpstream(ctx, name, srv)
		if err != nil {
			u.Close()
			return nil, fmt.Errorf("upstream %q: %w", name, err)
		}
		u.sessions = append(u.sessions, cs)
		group := unique(minipy.Identifier(name), groups)
		fns, err := upstreamFunctions(ctx, cs, group)
		if err != nil {
			u.Close()
			return nil, fmt.Errorf("upstream %q: listing its tools: %w", name, err)
		}
		log.Printf("minipy-mcp: upstream %s: %d tools, as %s.<tool>(...) in the code", name, len(fns), group)
		u.functions = append(u.functions, fns...)
	}
	return u, nil
}

func connectUpstream(ctx context.Context, name string, srv upstreamServer) (*mcp.ClientSession, error) {
	var transport mcp.Transport
	switch {
	case srv.Command != "" && srv.URL != "":
		return nil, errors.New(`give "command" or "url", not both`)
	case srv.Command != "":
		cmd := exec.Command(srv.Command, srv.Args...)
		cmd.Env = nil
		for _, k := range inheritedEnv {
			if v, ok := os.LookupEnv(k); ok {
				cmd.Env = append(cmd.Env, k+"="+v)
			}
		}
		for k, v := range srv.Env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Dir = srv.Cwd
		cmd.Stderr = os.Stderr // its log, next to ours
		transport = &mcp.CommandTransport{Command: cmd}
	case srv.URL != "":
		client := &http.Client{Transport: headerTransport{headers: srv.Headers, next: http.DefaultTransport}}
		switch strings.ToLower(srv.Type) {
		case "", "http", "streamable-http", "streamablehttp", "streamable_http":
			transport = &mcp.StreamableClientTransport{Endpoint: srv.URL, HTTPClient: client}
		case "sse":
			transport = &mcp.SSEClientTransport{Endpoint: srv.URL, HTTPClient: client}
		default:
			return nil, fmt.Errorf("unknown type %q (stdio, http or sse)", srv.Type)
		}
	default:
		return nil, errors.New(`neither "command" nor "url" is set`)
	}
	client := mcp.NewClient(&mcp.Implementation{Name: "minipy-mcp", Version: version}, nil)
	return client.Connect(ctx, transport, nil)
}

// inheritedEnv is what a started server gets of minipy-mcp's environment besides its
// "env": the variables the official TypeScript SDK's stdio client passes by default. The rest
// (an agent's API keys, say) stays out of the servers, whose tools the model's code calls.
var inheritedEnv = []string{"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER"}

// headerTransport adds a server's configured headers (an Authorization, say) to requests.
type headerTransport struct {
	headers map[string]string
	next    http.RoundTripper
}

func (t headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if len(t.headers) > 0 {
		req = req.Clone(req.Context())
		for k, v := range t.headers {
			req.Header.Set(k, v)
		}
	}
	return t.next.RoundTrip(req)
}

// upstreamFunctions makes each tool of cs a host function named group.tool.
func upstreamFunctions(ctx context.Context, cs *mcp.ClientSession, group string) ([]minipy.Function, error) {
	var fns []minipy.Function
	used := map[string]bool{}
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return nil, err
		}
		name := tool.Name
		desc := tool.Description
		if desc == "" {
			desc = tool.Title
		}
		input, err := schemaMap(tool.InputSchema)
		if err != nil {
			return nil, fmt.Errorf("tool %s: input schema: %w", name, err)
		}
		output, _ := schemaMap(tool.OutputSchema)
		pyName := group + "." + unique(minipy.Identifier(name), used)
		fns = append(fns, minipy.Function{
			Name:         pyName,
			Description:  desc,
			InputSchema:  input,
			OutputSchema: output,
			Call: func(ctx context.Context, args map[string]any) (any, error) {
				res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
				if err != nil {
					return nil, err
				}
				if res.IsError {
					return nil, errors.New(resultText(res))
				}
				return resultValue(pyName+"()", res), nil
			},
		})
	}
	return fns, nil
}

// Close ends the upstream sessions (and stops the servers this process started).
func (u *upstreams) Close() {
	if u == nil {
		return
	}
	for _, cs := range u.sessions {
		cs.Close() //nolint:errcheck // shutting down
	}
}

// schemaMap is a schema of the SDK's (any JSON value) as a map; nil for none.
func schemaMap(s any) (map[string]any, error) {
	if s == nil {
		return nil, nil
	}
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// resultValue is a tool result as a Python value: its structured content when it has
// some, else its content: one item as itself, several as a list. Text is a str, a resource
// link a dict; images and audio a short description ("[image: image/png, 1234 bytes]").
// Each image is also shown (minipy.WithDisplays), as if the code had displayed it, so that
// it reaches the model as an image.
func resultValue(tool string, res *mcp.CallToolResult) any {
	var displays []minipy.Display
	for _, c := range res.Content {
		if img, ok := c.(*mcp.ImageContent); ok {
			displays = append(displays, minipy.Display{Data: map[string][]byte{
				img.MIMEType: img.Data,
				"text/plain": fmt.Appendf(nil, "<%s image from %s>", img.MIMEType, tool),
			}})
		}
	}
	value := plainValue(res)
	if len(displays) > 0 {
		return minipy.WithDisplays(value, displays...)
	}
	return value
}

func plainValue(res *mcp.CallToolResult) any {
	if res.StructuredContent != nil {
		if raw, err := json.Marshal(res.StructuredContent); err == nil {
			return json.RawMessage(raw) // minipy converts it as the JSON value it holds
		}
	}
	items := make([]any, 0, len(res.Content))
	for _, c := range res.Content {
		items = append(items, contentValue(c))
	}
	switch len(items) {
	case 0:
		return nil
	case 1:
		return items[0]
	}
	return items
}

func contentValue(c mcp.Content) any {
	switch x := c.(type) {
	case *mcp.TextContent:
		return x.Text
	case *mcp.ImageContent:
		return fmt.Sprintf("[image: %s, %d bytes]", x.MIMEType, len(x.Data))
	case *mcp.AudioContent:
		return fmt.Sprintf("[audio: %s, %d bytes]", x.MIMEType, len(x.Data))
	case *mcp.ResourceLink:
		link := map[string]any{"type": "resource_link", "uri": x.URI, "name": x.Name}
		for k, v := range map[string]string{"title": x.Title, "description": x.Description, "mimeType": x.MIMEType} {
			if v != "" {
				link[k] = v
			}
		}
		return link
	case *mcp.EmbeddedResource:
		r := x.Resource
		if r == nil {
			return nil
		}
		res := map[string]any{"type": "resource", "uri": r.URI}
		if r.MIMEType != "" {
			res["mimeType"] = r.MIMEType
		}
		if r.Text != "" {
			res["text"] = r.Text
		}
		if r.Blob != nil {
			res["blob"] = base64.StdEncoding.EncodeToString(r.Blob)
		}
		return res
	}
	return fmt.Sprintf("[%T content]", c)
}

// resultText is the text of an error result, for minipy.HostError.
func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, t.Text)
		}
	}
	if len(parts) == 0 {
		return "the tool reported an error"
	}
	return strings.Join(parts, "\n")
}

// unique returns name, or name_2, name_3, ... if it is taken, and takes it.
func unique(name string, used map[string]bool) string {
	n := name
	for i := 2; used[n]; i++ {
		n = fmt.Sprintf("%s_%d", name, i)
	}
	used[n] = true
	return n
}
