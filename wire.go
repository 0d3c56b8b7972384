package minipy

// The runtime's requests and replies (runtime.py's dispatch), the same for both engines:
// the in-process one calls dispatch, the isolated one sends them to a worker in frames.

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// runRequest is the request runtime.py's dispatch answers with a run: op, namespace ids,
// output cap, flags (pyrt.RunLive, pyrt.RunHostCalls), source.
func runRequest(gid, lid uint32, maxOutput int, live, hostCalls bool, images imageLimits, code string) []byte {
	req := make([]byte, 0, 25+len(code))
	req = append(req, pyrt.OpRun)
	req = binary.LittleEndian.AppendUint32(req, gid)
	req = binary.LittleEndian.AppendUint32(req, lid)
	req = binary.LittleEndian.AppendUint32(req, uint32(int32(maxOutput)))
	var flags uint32
	if live {
		flags |= pyrt.RunLive
	}
	if hostCalls {
		flags |= pyrt.RunHostCalls
	}
	req = binary.LittleEndian.AppendUint32(req, flags)
	req = binary.LittleEndian.AppendUint32(req, uint32(int32(images.count)))
	req = binary.LittleEndian.AppendUint32(req, uint32(int32(images.bytes)))
	return append(req, code...)
}

// opRequest is a namespace request: the op byte and its arguments as a list.
func opRequest(op byte, args []any) ([]byte, error) {
	if len(args) == 0 {
		return []byte{op}, nil
	}
	return appendValue([]byte{op}, args, 0)
}

// opReply decodes the reply to opRequest.
func opReply(resp []byte) (any, error) {
	if len(resp) == 0 {
		return nil, errTruncated
	}
	d := decoder{buf: resp, pos: 1}
	v, err := d.value()
	if err != nil {
		return nil, err
	}
	if resp[0] == 0 {
		return v, nil
	}
	return nil, replyError(v)
}

// replyError turns a runtime.py error reply ([kind, message]) into an error.
func replyError(v any) error {
	parts, _ := v.([]any)
	if len(parts) != 2 {
		return errTruncated
	}
	kind, _ := parts[0].(string)
	msg, _ := parts[1].(string)
	switch kind {
	case "name":
		return fmt.Errorf("%w: %s", ErrNameNotFound, msg)
	case "unsupported":
		return fmt.Errorf("%w: %s", ErrUnsupportedValue, msg)
	case "namespace":
		return fmt.Errorf("%w: %s", ErrNamespaceClosed, msg)
	case "fork":
		return fmt.Errorf("%w: %s", ErrNoFork, msg)
	case "state":
		return fmt.Errorf("%w: %s", ErrBadState, msg)
	case "too_large":
		return fmt.Errorf("%w: %s", ErrTooLarge, msg)
	}
	return fmt.Errorf("minipy: internal error in the Python runtime: %s", msg)
}

// runReply decodes the reply to runRequest into res and the code's error, if any.
func runReply(resp []byte, res *Result) (*PythonError, error) {
	py, err := decodeRunReply(resp, res)
	if errors.Is(err, errTruncated) {
		// Never expected; say enough to diagnose it.
		head := resp[:min(len(resp), 48)]
		err = fmt.Errorf("%w (%d bytes, starting %q)", err, len(resp), head)
	}
	return py, err
}

func decodeRunReply(resp []byte, res *Result) (*PythonError, error) {
	if len(resp) == 0 {
		return nil, errTruncated
	}
	d := decoder{buf: resp, pos: 1}
	if resp[0] != 0 {
		v, err := d.value()
		if err != nil {
			return nil, err
		}
		return nil, replyError(v)
	}
	fields := [8]any{}
	for i := range fields {
		v, err := d.value()
		if err != nil {
			return nil, err
		}
		fields[i] = v
	}
	res.HasValue, _ = fields[0].(bool)
	if _, ok := fields[1].(opaque); !ok {
		res.Value = fields[1]
	}
	res.Repr, _ = fields[2].(string)
	res.Stdout, _ = fields[3].(string)
	displays, err := decodeDisplays(fields[7], res.Stdout)
	if err != nil {
		return nil, err
	}
	res.Displays = displays
	res.Stderr, _ = fields[4].(string)
	if e, ok := fields[5].([]any); ok && len(e) == 3 {
		py := &PythonError{}
		py.Type, _ = e[0].(string)
		py.Message, _ = e[1].(string)
		py.Traceback, _ = e[2].(string)
		return py, nil
	}
	return nil, nil
}
