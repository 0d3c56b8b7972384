// Package templates builds E2B's templates (the SDK's Template.build) for minipy-mcp's E2B
// front: a template is what a sandbox holds after a build's steps ran in it (its files,
// anywhere it writes), with the environment, working directory and start command the steps
// set. A build runs in a sandbox like any other (a Machine, which the front gives), so each
// step has exactly the powers of the sandbox's code: a RUN is a command there, a COPY is an
// upload unpacked there by the sandbox's own tar. What the steps leave is the front's to keep
// (as a snapshot: E2B's snapshots are templates too).
//
// minipy's image is the server's: a template starts from it (fromBaseImage, E2B's
// e2bdev/base; fromTemplate of a served template or of the user's own), never from another
// image (fromImage of anything else, fromDockerfile: refused, saying what is served). Its one
// user is "user" (uid 1000); a step as root is refused until the sandbox has a root of its
// own.
package templates

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
)

// BaseImage is the image fromBaseImage names (E2B's default base): minipy's own.
const BaseImage = "e2bdev/base"

// DefaultUser and DefaultWorkdir are a build's user and working directory until its steps
// set others (E2B's defaults).
const (
	DefaultUser = "user"
	// RootUser is the sandbox's root, whom steps may run as where it has one
	// (Machine.RootUser).
	RootUser       = "root"
	DefaultWorkdir = "/home/user"
)

// Bounds of a build's request.
const (
	maxSteps   = 1000
	maxArgs    = 1000
	maxCommand = 64 << 10 // a RUN's command line, a start or ready command
)

// ErrRefused is matched by the errors of a build request that minipy does not serve (an
// image of its own, root), as against one that is malformed.
var ErrRefused = errors.New("not served by minipy")

// Spec is a build's request (E2B's TemplateBuildStartV2).
type Spec struct {
	FromImage         string          `json:"fromImage"`
	FromTemplate      string          `json:"fromTemplate"`
	FromImageRegistry json.RawMessage `json:"fromImageRegistry"`
	Force             bool            `json:"force"`
	Steps             []Step          `json:"steps"`
	StartCmd          string          `json:"startCmd"`
	ReadyCmd          string          `json:"readyCmd"`
}

// Step is one step of a build (E2B's TemplateStep): COPY, RUN, ENV, WORKDIR or USER (the
// SDK's other methods are RUNs: makeDir, makeSymlink, remove, rename, pipInstall...).
type Step struct {
	Type      string   `json:"type"`
	Args      []string `json:"args"`
	FilesHash string   `json:"filesHash"`
	Force     bool     `json:"force"`
}

// Base checks the spec's base and steps, and returns the template it starts from: image
// (the served template that is BaseImage) for fromBaseImage or no base, else fromTemplate's
// name (a served template's, or one of the user's: the caller looks it up). served names
// the templates the server serves, for the refusal's words.
func (sp *Spec) Base(image string, served []string) (string, error) {
	switch {
	case sp.FromImage != "" && sp.FromTemplate != "":
		return "", errors.New("fromImage and fromTemplate: a template starts from one of them")
	case len(sp.FromImageRegistry) > 0 && string(sp.FromImageRegistry) != "null":
		return "", fmt.Errorf("%w: images from registries: minipy builds templates on its own image (fromBaseImage, "+
			"fromTemplate)", ErrRefused)
	case len(sp.Steps) > maxSteps:
		return "", fmt.Errorf("%d steps: at most %d", len(sp.Steps), maxSteps)
	case len(sp.StartCmd) > maxCommand || len(sp.ReadyCmd) > maxCommand:
		return "", fmt.Errorf("the start or ready command: at most %d bytes", maxCommand)
	case sp.ReadyCmd != "" && sp.StartCmd == "":
		return "", errors.New("a ready command without a start command")
	}
	for i, st := range sp.Steps {
		if err := st.check(); err != nil {
			return "", fmt.Errorf("step %d (%s): %w", i+1, st.Type, err)
		}
	}
	switch {
	case sp.FromTemplate != "":
		return sp.FromTemplate, nil
	case sp.FromImage == "" || sp.FromImage == BaseImage:
		return image, nil
	}
	return "", fmt.Errorf("%w: fromImage %q: minipy's sandboxes run on the server's own image, which "+
		"fromBaseImage() (%s) names; build on it or on a template (fromTemplate: %s, or one of yours)", ErrRefused,
		sp.FromImage, BaseImage, strings.Join(served, ", "))
}

// check checks a step's type and arguments.
func (st *Step) check() error {
	if len(st.Args) > maxArgs {
		return fmt.Errorf("%d arguments: at most %d", len(st.Args), maxArgs)
	}
	for _, a := range st.Args {
		if strings.ContainsRune(a, 0) {
			return errors.New("an argument holds a NUL")
		}
	}
	n := len(st.Args)
	switch st.Type {
	case "RUN":
		if n < 1 || n > 2 || st.Args[0] == "" || len(st.Args[0]) > maxCommand {
			return errors.New("a command and, maybe, its user")
		}
	case "COPY":
		if n < 2 || n > 4 || st.Args[0] == "" || st.Args[1] == "" || st.FilesHash == "" {
			return errors.New("a source, a destination, maybe a user and a mode, and the files' hash")
		}
		if !ValidHash(st.FilesHash) {
			return fmt.Errorf("files hash %q: hex digits", st.FilesHash)
		}
		if n == 4 && st.Args[3] != "" && strings.Trim(st.Args[3], "01234567") != "" {
			return fmt.Errorf("mode %q: octal digits", st.Args[3])
		}
	case "ENV":
		if n == 0 || n%2 != 0 {
			return errors.New("names and values, in pairs")
		}
		for i := 0; i < n; i += 2 {
			if st.Args[i] == "" || strings.Contains(st.Args[i], "=") {
				return fmt.Errorf("environment variable %q: a name is not empty and holds no '='", st.Args[i])
			}
		}
	case "WORKDIR":
		if n != 1 || st.Args[0] == "" {
			return errors.New("one directory")
		}
	case "USER":
		if n != 1 || st.Args[0] == "" {
			return errors.New("one user")
		}
	default:
		return fmt.Errorf("%w: a step of type %q (COPY, RUN, ENV, WORKDIR and USER are)", ErrRefused, st.Type)
	}
	return nil
}

// ValidHash reports whether h is a files hash as the SDK makes them (SHA-256, hex).
func ValidHash(h string) bool {
	return len(h) >= 16 && len(h) <= 128 && strings.Trim(h, "0123456789abcdefABCDEF") == ""
}

// checkUser checks the user a step runs as ("" for the build's own, which USER set):
// minipy's sandbox has "user" and, where the server runs as root (rootOK), "root". It
// returns the user the step runs as.
func checkUser(user, current, what string, rootOK bool) (string, error) {
	if user == "" {
		user = current
	}
	switch {
	case user == DefaultUser, user == RootUser && rootOK:
		return user, nil
	case user == RootUser:
		return "", fmt.Errorf("%w: failed to %s: root: this server's sandboxes have one user, %q (uid 1000), and "+
			"no root: it does not run as root (docs/e2b.md)", ErrRefused, what, DefaultUser)
	}
	// (E2B's envd's own words for a user its image does not have)
	return "", fmt.Errorf("failed to %s: command failed: unauthenticated: invalid username: '%s'", what, user)
}

// inDir is name as an absolute path, relative names from dir.
func inDir(dir, name string) string {
	if path.IsAbs(name) {
		return path.Clean(name)
	}
	return path.Join(dir, name)
}
