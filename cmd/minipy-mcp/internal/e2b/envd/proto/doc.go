// Package proto holds E2B's envd protocol: filesystem/filesystem.proto and
// process/process.proto, copied unchanged
// from github.com/e2b-dev/E2B (spec/envd, commit b8029973, Apache License 2.0), the
// protocol E2B's SDKs speak to a sandbox's daemon, and the Go code generated from it
// (protoc-gen-go v1.36.12, protoc-gen-connect-go v1.21.1; run `go generate` here with
// protoc and both plugins on PATH after replacing a .proto).
package proto

//go:generate protoc -I . --go_out=. --go_opt=paths=source_relative --go_opt=Mfilesystem/filesystem.proto=github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b/envd/proto/filesystem --connect-go_out=. --connect-go_opt=paths=source_relative --connect-go_opt=Mfilesystem/filesystem.proto=github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b/envd/proto/filesystem filesystem/filesystem.proto
//go:generate protoc -I . --go_out=. --go_opt=paths=source_relative --go_opt=Mprocess/process.proto=github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b/envd/proto/process --connect-go_out=. --connect-go_opt=paths=source_relative --connect-go_opt=Mprocess/process.proto=github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b/envd/proto/process process/process.proto
