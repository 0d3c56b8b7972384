// See cpython.h. Facts this file relies on are in docs/embedding-cpython.md:
// CPython's "main thread" is the one that initialised it, signal-based interrupts only work
// there, and PyErr_SetInterruptEx from another thread is not noticed by a busy loop.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX < 0x030B0000
#error "minipy needs CPython 3.11 or later: pkg-config python3-embed names an older one (set PKG_CONFIG_PATH to a newer one's lib/pkgconfig)"
#endif

#include <dlfcn.h>  // dladdr: a GNU extension, and Python.h defines _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cpython.h"
#include "_cgo_export.h"

// How long each side busy-waits (yielding after 20 us, see cpu_relax) before sleeping on
// the futex. Waking a sleeping thread costs 50-150 us on a VM whose idle vCPU has halted,
// far more than a small run: the caller waits up to 1 ms this way (a 30-line cell went from
// 470 to 370-385 us), and the owner 60 us for the next request, which bounds what an idle
// interpreter burns.
#define CALLER_SPIN_NS 1000000
#define OWNER_SPIN_NS 60000

static struct {
	pthread_t owner;
	int sig;
	PyThreadState *ts;
	PyObject *dispatch;
	PyObject *timeout_cls;
	PyObject *runtime_file;
	int hard_stop_on;

	_Atomic uint32_t init_state;  // 0 starting, 1 ready, 2 failed (futex word)
	char init_error[2048];

	// The request slot. job_seq and wake_seq are futex words; *_sleeping tell the other
	// side whether a FUTEX_WAKE is needed at all (it costs a syscall).
	_Atomic uint32_t job_seq;
	_Atomic uint32_t owner_sleeping;
	_Atomic uint32_t wake_seq;
	_Atomic uint32_t callers_sleeping;
	_Atomic uint32_t wakes;  // mp_wake calls, told apart from events (which bump wake_seq too)
	_Atomic uint64_t done_gen;
	char *req;
	size_t req_len;
	uint64_t req_gen;
	char *resp;
	size_t resp_len;
	int resp_kicked;

	// Kick state, under mu: the watchdog may interrupt only the generation it watches, and
	// only while it runs, so a late deadline never leaks into the next request.
	pthread_mutex_t mu;
	uint64_t gen;
	int running;
	int host_calls;  // the request may call host functions
	int kicked;
	volatile sig_atomic_t stage;
	volatile sig_atomic_t armed;
} mp = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

// cpu_relax is one step of a spin-wait. After 20 us it yields the CPU instead: on a busy
// machine the thread we wait for may need this very core. (Measured on a 2-vCPU VM: yielding
// after 3 us made a `1+1` run 15-18 us instead of 12-13 us, a syscall per step being dearer
// than the wait it saves.)
static inline void cpu_relax(int64_t spun_ns) {
	if (spun_ns > 20000) {
		sched_yield();
		return;
	}
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

static void futex_wait(_Atomic uint32_t *word, uint32_t expect, int64_t timeout_ns) {
	struct timespec ts, *tsp = NULL;
	if (timeout_ns >= 0) {
		ts.tv_sec = timeout_ns / 1000000000;
		ts.tv_nsec = timeout_ns % 1000000000;
		tsp = &ts;
	}
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_PRIVATE, expect, tsp, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word) {
	syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL, NULL, 0);
}

// ---- the kick ------------------------------------------------------------------------

// Installed for the kick signal with SA_ONSTACK (required under Go) and without SA_RESTART,
// so blocking calls on the owner thread return EINTR and CPython's retry loops check signals.
static void kick_handler(int sig) {
	int saved = errno;
	if (mp.armed) {
		PyErr_SetInterruptEx(sig);  // async-signal-safe; runs the runtime's _on_kick
	}
	errno = saved;
}

static void calls_stop(uint64_t gen);

void mp_kick(uint64_t gen, int stage) {
	pthread_mutex_lock(&mp.mu);
	if (mp.gen == gen && mp.running) {
		mp.kicked++;
		if (stage > mp.stage) {
			mp.stage = stage;
		}
		mp.armed = 1;
		pthread_kill(mp.owner, mp.sig);
		// Then end the waits for the host: the owner's signal is pending by now, so its
		// handler raises as the owner's call returns (runtime.py's _call covers a late one).
		calls_stop(gen);
	}
	pthread_mutex_unlock(&mp.mu);
}

// ---- run events ----------------------------------------------------------------------

// Events of the run in progress (its live output; docs/protocol.md) wait here for the
// caller, in the frame format a worker sends them in, so that Go decodes both engines' events
// with one function. The run never waits for the caller: beyond EVENTS_MAX bytes queued,
// output is dropped and counted (the caller drains far more often than that; only an
// abandoned run, whose caller has gone, fills it).
#define EVENTS_MAX (8 << 20)

static struct {
	pthread_mutex_t mu;
	char *buf;
	size_t len, cap;
	uint64_t dropped;
} ev = {.mu = PTHREAD_MUTEX_INITIALIZER};
static _Atomic uint32_t ev_pending;  // set by the first event after a drain

// ---- host calls ----------------------------------------------------------------------
//
// A Python thread that calls a host function (c_host_call) queues the call and waits on
// its state, a futex word, without the GIL, until Go replies (mp_reply) or the run is
// stopped (calls_stop). Go serves calls on goroutines that wait in mp_host_next for the
// next one, spinning briefly first: the reply to a quick function (add(1, 2)) then takes a
// few microseconds, with no thread to wake and no hop through the Go scheduler. The run's
// own caller is not involved, so a function that ignores its ctx cannot delay the run's
// return past its deadline. Calls live in a list under ev.mu; only the waiting thread
// unlinks and frees its call, so mp_reply, calls_stop and mp_host_next may touch any call
// they find in the list.
typedef struct mp_call {
	struct mp_call *prev, *next;
	uint64_t id, gen;
	char *frame;              // the call event for Go, until a server takes it
	size_t frame_len;
	_Atomic uint32_t state;   // 0 waiting, 1 replied, 2 stopped
	_Atomic uint32_t asleep;  // the waiter sleeps on state: a change must wake it
	int status;               // pyrt.Call*
	char *resp;
	size_t resp_len;
} mp_call;

static mp_call calls = {.prev = &calls, .next = &calls};  // the list's sentinel, under ev.mu
static uint64_t call_seq;                                  // under ev.mu
static _Atomic uint32_t calls_queued;   // calls no server has taken (their frame is set)
static _Atomic uint32_t calls_seq;      // futex word of waiting servers: bumped per new call
static _Atomic uint32_t servers_asleep; // servers in futex_wait on calls_seq
static _Atomic uint32_t servers_spinning;  // a server spins for the next call (at most one)

// calls_stop ends the waits of gen's calls. mp.mu may be held (it comes before ev.mu).
static void calls_stop(uint64_t gen) {
	pthread_mutex_lock(&ev.mu);
	for (mp_call *c = calls.next; c != &calls; c = c->next) {
		if (c->gen == gen && atomic_load(&c->state) == 0) {
			c->status = 3;  // pyrt.CallStopped
			atomic_store(&c->state, 2);
			if (atomic_load(&c->asleep)) {
				futex_wake_all(&c->state);
			}
		}
	}
	pthread_mutex_unlock(&ev.mu);
}

// events_reset empties the queue for a new request (under no lock of the owner's: the
// previous request is over).
static void events_reset(void) {
	pthread_mutex_lock(&ev.mu);
	ev.len = 0;
	ev.dropped = 0;
	atomic_store(&ev_pending, 0);
	pthread_mutex_unlock(&ev.mu);
}

// ev_append appends a frame of kind for gen, with head (hn bytes) then data (dn bytes)
// as its payload, growing the queue as needed; returns 0, or -1 without memory. Under ev.mu.
static int ev_append(char kind, uint64_t gen, const void *head, size_t hn, const void *data, size_t dn) {
	size_t body = 1 + 8 + hn + dn;
	if (ev.len + 4 + body > ev.cap) {
		size_t cap = ev.cap ? ev.cap : 4096;
		while (cap < ev.len + 4 + body) {
			cap *= 2;
		}
		char *grown = realloc(ev.buf, cap);
		if (!grown) {
			return -1;
		}
		ev.buf = grown;
		ev.cap = cap;
	}
	char *p = ev.buf + ev.len;
	uint32_t n = (uint32_t)body;
	memcpy(p, &n, 4);
	p[4] = kind;
	memcpy(p + 5, &gen, 8);
	memcpy(p + 13, head, hn);
	memcpy(p + 13 + hn, data, dn);
	ev.len += 4 + body;
	return 0;
}

// wake_caller tells a waiting mp_wait that events are queued.
static void wake_caller(void) {
	atomic_fetch_add(&mp.wake_seq, 1);
	if (atomic_load(&mp.callers_sleeping)) {
		futex_wake_all(&mp.wake_seq);
	}
}

// release_emitted frees what c_emit took to read obj.
static void release_emitted(PyObject *obj, Py_buffer *data, PyObject *encoded) {
	if (!PyUnicode_Check(obj)) {
		PyBuffer_Release(data);
	}
	Py_XDECREF(encoded);
}

static PyObject *c_emit(PyObject *self, PyObject *args) {
	char kind;
	int stream;
	PyObject *obj, *encoded = NULL;
	if (!PyArg_ParseTuple(args, "ciO", &kind, &stream, &obj)) {
		return NULL;
	}
	// Text as UTF-8 (lone surrogates as their three bytes, like the capture's own encoding),
	// or bytes as they are.
	Py_buffer data = {0};
	if (PyUnicode_Check(obj)) {
		Py_ssize_t n;
		const char *utf8 = PyUnicode_AsUTF8AndSize(obj, &n);
		if (!utf8) {
			PyErr_Clear();
			encoded = PyUnicode_AsEncodedString(obj, "utf-8", "surrogatepass");
			if (!encoded) {
				return NULL;
			}
			utf8 = PyBytes_AS_STRING(encoded);
			n = PyBytes_GET_SIZE(encoded);
		}
		data.buf = (void *)utf8;
		data.len = n;
	} else if (PyObject_GetBuffer(obj, &data, PyBUF_SIMPLE) < 0) {
		return NULL;
	} else {
		encoded = obj;  // released below through the buffer
		Py_INCREF(encoded);
	}
	uint64_t gen = mp.req_gen;  // set before the request was handed to this thread
	size_t body = 1 + 8 + 1 + (size_t)data.len;
	int first = 0;
	pthread_mutex_lock(&ev.mu);
	if (ev.len + 4 + body > EVENTS_MAX || body > UINT32_MAX) {
		ev.dropped += (uint64_t)data.len;
	} else {
		char st = (char)stream;
		if (ev_append(kind, gen, &st, 1, data.buf, (size_t)data.len) < 0) {
			pthread_mutex_unlock(&ev.mu);
			release_emitted(obj, &data, encoded);
			return PyErr_NoMemory();
		}
	}
	first = atomic_exchange(&ev_pending, 1) == 0;
	pthread_mutex_unlock(&ev.mu);
	release_emitted(obj, &data, encoded);
	if (first) {
		wake_caller();
	}
	Py_RETURN_NONE;
}

// How long a host call's thread spins for the reply before it sleeps: a quick Go function
// (add(1, 2)) answers within a few microseconds, and sleeping would add a thread wake-up
// (50-150 us on an idle VM) to each call.
#define CALL_SPIN_NS 100000
// How long a server spins for the next call before it sleeps: a loop of calls finds it
// awake.
#define SERVER_SPIN_NS 50000

// host_call_inline runs the call event frame (made by c_host_call, call id 0) on this, the
// owner, thread: Go's mpHostCallInline serves it and returns at once, without the GIL, with
// no server to wake and no reply to wait for. Only for Function.Inline's functions: a Go
// function that ignores its ctx holds the run here past its deadline, as a C loop would.
static PyObject *host_call_inline(mp_call *c) {
	pthread_mutex_lock(&mp.mu);
	int refused = !mp.running || !mp.host_calls ? 4 : mp.kicked ? 3 : 0;  // pyrt.CallRefused, CallStopped
	uint64_t gen = mp.gen;
	pthread_mutex_unlock(&mp.mu);
	PyObject *reply = NULL;
	if (refused) {
		reply = Py_BuildValue("(iy)", refused, refused == 4 ? "host functions can be called only while a run of their namespace is in progress" : "");
	} else {
		memcpy(c->frame + 5, &gen, 8);
		memset(c->frame + 13, 0, 8);
		int status = 0;
		char *resp = NULL;
		size_t resp_len = 0;
		Py_BEGIN_ALLOW_THREADS
		mpHostCallInline(c->frame, c->frame_len, &status, &resp, &resp_len);
		// Stopped (the run's ctx is done): as a served call's wait ends only with the
		// run's kick, wait for it (up to a second), so that the run ends as a kicked one.
		for (int i = 0; status == 3 && i < 50000; i++) {
			pthread_mutex_lock(&mp.mu);
			int kicked = mp.kicked || mp.gen != gen;
			pthread_mutex_unlock(&mp.mu);
			if (kicked) {
				break;
			}
			struct timespec pause = {0, 20000};
			nanosleep(&pause, NULL);
		}
		Py_END_ALLOW_THREADS
		if (status != 3 || PyErr_CheckSignals() == 0) {  // stopped: the kick's handler raises, if it will
			reply = Py_BuildValue("(iy#)", status, resp ? resp : "", (Py_ssize_t)resp_len);
		}
		free(resp);
	}
	free(c->frame);
	free(c);
	return reply;
}

// host_call(payload, inline) -> (status, reply): queue a call event for Go and wait, without
// the GIL, for its reply (see mp_call). A run that is stopped meanwhile ends the wait: on the
// owner thread the kick's handler then raises; elsewhere the status says CallStopped. With
// inline (Function.Inline) the owner thread serves the call itself (host_call_inline).
static PyObject *c_host_call(PyObject *self, PyObject *args) {
	Py_buffer data;
	int inline_call = 0;
	if (!PyArg_ParseTuple(args, "y*|p", &data, &inline_call)) {
		return NULL;
	}
	if (data.len > UINT32_MAX - 64) {
		PyBuffer_Release(&data);
		PyErr_SetString(PyExc_ValueError, "the arguments of a host call are too large");
		return NULL;
	}
	mp_call *c = calloc(1, sizeof *c);
	if (!c) {
		PyBuffer_Release(&data);
		return PyErr_NoMemory();
	}
	// The call event: the frame format of every run event (docs/protocol.md), so that Go
	// decodes it like a worker's.
	size_t body = 1 + 8 + 8 + (size_t)data.len;
	c->frame = malloc(4 + body);
	if (!c->frame) {
		free(c);
		PyBuffer_Release(&data);
		return PyErr_NoMemory();
	}
	c->frame_len = 4 + body;
	uint32_t n32 = (uint32_t)body;
	memcpy(c->frame, &n32, 4);
	c->frame[4] = 'C';
	memcpy(c->frame + 21, data.buf, (size_t)data.len);
	PyBuffer_Release(&data);
	if (inline_call && pthread_equal(pthread_self(), mp.owner)) {
		return host_call_inline(c);
	}
	// Under mp.mu: a run that has ended (or was stopped) takes no more calls.
	pthread_mutex_lock(&mp.mu);
	int refused = !mp.running || !mp.host_calls ? 4 : mp.kicked ? 3 : 0;  // pyrt.CallRefused, CallStopped
	if (!refused) {
		pthread_mutex_lock(&ev.mu);
		c->id = ++call_seq;
		c->gen = mp.gen;
		memcpy(c->frame + 5, &c->gen, 8);
		memcpy(c->frame + 13, &c->id, 8);
		c->next = &calls;
		c->prev = calls.prev;
		calls.prev->next = c;
		calls.prev = c;
		atomic_fetch_add(&calls_queued, 1);
		pthread_mutex_unlock(&ev.mu);
	}
	pthread_mutex_unlock(&mp.mu);
	if (refused) {
		free(c->frame);
		free(c);
		return Py_BuildValue("(iy)", refused, refused == 4 ? "host functions can be called only while a run of their namespace is in progress" : "");
	}
	atomic_fetch_add(&calls_seq, 1);
	if (atomic_load(&servers_asleep)) {
		syscall(SYS_futex, (uint32_t *)&calls_seq, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
	}

	Py_BEGIN_ALLOW_THREADS
	int64_t start = now_ns();
	for (int64_t now = start; atomic_load(&c->state) == 0 && now < start + CALL_SPIN_NS; now = now_ns()) {
		cpu_relax(now - start);
	}
	atomic_store(&c->asleep, 1);
	while (atomic_load(&c->state) == 0) {
		futex_wait(&c->state, 0, -1);  // a kick's signal ends it too (EINTR), on the owner thread
	}
	Py_END_ALLOW_THREADS

	pthread_mutex_lock(&ev.mu);
	c->prev->next = c->next;
	c->next->prev = c->prev;
	if (c->frame) {  // stopped before a server took it
		atomic_fetch_sub(&calls_queued, 1);
		free(c->frame);
	}
	pthread_mutex_unlock(&ev.mu);
	int status = c->status;
	PyObject *reply = NULL;
	if (atomic_load(&c->state) == 1) {
		reply = Py_BuildValue("(iy#)", status, c->resp ? c->resp : "", (Py_ssize_t)c->resp_len);
	} else if (PyErr_CheckSignals() == 0) {  // stopped: the kick's handler raises, if it will
		reply = Py_BuildValue("(iy)", 3, "");
	}
	free(c->resp);
	free(c);
	return reply;
}

char *mp_host_next(int64_t timeout_ns, size_t *len) {
	int64_t start = now_ns();
	int64_t deadline = timeout_ns < 0 ? INT64_MAX : start + timeout_ns;
	// One server spins, the others sleep: each spinning thread takes a CPU from the code.
	uint32_t none = 0;
	if (atomic_compare_exchange_strong(&servers_spinning, &none, 1)) {
		for (int64_t now = start; now < start + SERVER_SPIN_NS && !atomic_load(&calls_queued); now = now_ns()) {
			cpu_relax(now - start);
		}
		atomic_store(&servers_spinning, 0);
	}
	char *frame = NULL;
	for (;;) {
		uint32_t seq = atomic_load(&calls_seq);
		if (atomic_load(&calls_queued)) {
			pthread_mutex_lock(&ev.mu);
			for (mp_call *c = calls.next; c != &calls; c = c->next) {
				if (c->frame) {
					frame = c->frame;
					*len = c->frame_len;
					c->frame = NULL;
					atomic_fetch_sub(&calls_queued, 1);
					break;
				}
			}
			pthread_mutex_unlock(&ev.mu);
			if (frame) {
				break;
			}
		}
		int64_t now = now_ns();
		if (now >= deadline) {
			break;
		}
		atomic_fetch_add(&servers_asleep, 1);
		if (!atomic_load(&calls_queued)) {
			futex_wait(&calls_seq, seq, deadline == INT64_MAX ? -1 : deadline - now);
		}
		atomic_fetch_sub(&servers_asleep, 1);
	}
	return frame;
}

void mp_reply(uint64_t id, int status, const char *payload, size_t len) {
	pthread_mutex_lock(&ev.mu);
	for (mp_call *c = calls.next; c != &calls; c = c->next) {
		if (c->id == id) {
			if (atomic_load(&c->state) == 0) {
				c->resp = malloc(len ? len : 1);
				if (c->resp) {
					memcpy(c->resp, payload, len);
					c->resp_len = len;
					c->status = status;
				} else {
					c->status = 1;  // pyrt.CallError, with no message
				}
				atomic_store(&c->state, 1);
				if (atomic_load(&c->asleep)) {
					futex_wake_all(&c->state);  // a spinning waiter needs no system call
				}
			}
			break;
		}
	}
	pthread_mutex_unlock(&ev.mu);
}

char *mp_events(size_t *len, uint64_t *dropped) {
	pthread_mutex_lock(&ev.mu);
	atomic_store(&ev_pending, 0);
	*len = ev.len;
	*dropped = ev.dropped;
	ev.dropped = 0;
	char *out = NULL;
	if (ev.len) {
		out = malloc(ev.len);
		memcpy(out, ev.buf, ev.len);
		ev.len = 0;
	}
	if (ev.cap > (1 << 20)) {  // do not keep a big buffer for the rest of the process
		free(ev.buf);
		ev.buf = NULL;
		ev.cap = 0;
	}
	pthread_mutex_unlock(&ev.mu);
	return out;
}

// ---- the _minipy_c module: what runtime.py needs from C ------------------------------

static int hard_tracer(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg) {
	(void)obj;
	(void)arg;
	if (what != PyTrace_LINE && what != PyTrace_CALL) {
		return 0;
	}
	PyCodeObject *code = PyFrame_GetCode(frame);
	int ours = PyUnicode_Compare(code->co_filename, mp.runtime_file) == 0;
	Py_DECREF(code);
	if (ours) {
		return 0;
	}
	PyErr_SetString(mp.timeout_cls, "the run was stopped: it swallowed the first interrupt");
	return -1;
}

static PyObject *c_hard_stop(PyObject *self, PyObject *unused) {
	// A C tracer, unlike sys.settrace's, is not removed when it raises: it keeps raising
	// on every line until the code gives up (it only runs after the run swallowed stage 1).
	PyEval_SetTrace(hard_tracer, NULL);
	mp.hard_stop_on = 1;
	Py_RETURN_NONE;
}

static PyObject *c_clear_hard_stop(PyObject *self, PyObject *unused) {
	if (mp.hard_stop_on) {
		PyEval_SetTrace(NULL, NULL);
		mp.hard_stop_on = 0;
	}
	Py_RETURN_NONE;
}

static PyObject *c_kick_stage(PyObject *self, PyObject *unused) {
	return PyLong_FromLong(mp.stage);
}

static PyObject *c_async_raise(PyObject *self, PyObject *args) {
	unsigned long ident;
	PyObject *exc;
	if (!PyArg_ParseTuple(args, "kO", &ident, &exc)) {
		return NULL;
	}
	return PyLong_FromLong(PyThreadState_SetAsyncExc(ident, exc));
}

static PyMethodDef native_methods[] = {
    {"hard_stop", c_hard_stop, METH_NOARGS, "Raise the timeout on every line from now on."},
    {"clear_hard_stop", c_clear_hard_stop, METH_NOARGS, "Remove hard_stop's tracer."},
    {"kick_stage", c_kick_stage, METH_NOARGS, "The stage of the current kick."},
    {"async_raise", c_async_raise, METH_VARARGS, "PyThreadState_SetAsyncExc(ident, exc)."},
    {"emit", c_emit, METH_VARARGS, "emit(kind, stream, data): queue an event of the run for the caller."},
    {"host_call", c_host_call, METH_VARARGS, "host_call(payload, inline=False) -> (status, reply): call a host function."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT, "_minipy_c", "minipy's in-process engine helpers.", -1, native_methods,
};

// ---- initialisation ------------------------------------------------------------------

static void set_init_error_from_python(const char *what) {
#if PY_VERSION_HEX >= 0x030C0000
	PyObject *value = PyErr_GetRaisedException();  // 3.12+; PyErr_Fetch is deprecated there
#else
	PyObject *type, *value, *tb;
	PyErr_Fetch(&type, &value, &tb);
	Py_XDECREF(type);
	Py_XDECREF(tb);
#endif
	PyObject *s = value ? PyObject_Str(value) : NULL;
	const char *msg = s ? PyUnicode_AsUTF8(s) : NULL;
	snprintf(mp.init_error, sizeof mp.init_error, "%s: %s", what, msg ? msg : "unknown Python error");
	Py_XDECREF(s);
	Py_XDECREF(value);
	PyErr_Clear();
}

static int init_python(const char *src, const char *runtime_file, const char *executable, int sig) {
	PyConfig config;
	PyConfig_InitPythonConfig(&config);
	// Go owns SIGINT, SIGPIPE and SIGXFSZ; Python must not install or ignore handlers.
	config.install_signal_handlers = 0;
	config.parse_argv = 0;
	// The python beside the libpython (LinkedPython) is where CPython looks for its standard
	// library, as it would for that python: a libpython whose build prefix is not where it
	// lies (a distribution's build unpacked elsewhere) is found all the same. (PYTHONHOME
	// still wins.)
	PyStatus status = PyStatus_Ok();
	if (executable && executable[0]) {
		status = PyConfig_SetBytesString(&config, &config.program_name, executable);
	}
	if (!PyStatus_Exception(status)) {
		status = Py_InitializeFromConfig(&config);
	}
	PyConfig_Clear(&config);
	if (PyStatus_Exception(status)) {
		snprintf(mp.init_error, sizeof mp.init_error, "Py_InitializeFromConfig: %s%s%s",
		         status.func ? status.func : "", status.func ? ": " : "",
		         status.err_msg ? status.err_msg : "failed");
		return -1;
	}
	PyObject *native = PyModule_Create(&native_module);
	if (!native || PyDict_SetItemString(PyImport_GetModuleDict(), "_minipy_c", native) < 0) {
		set_init_error_from_python("creating _minipy_c");
		return -1;
	}
#ifdef Py_GIL_DISABLED
	// Free-threaded builds: the module keeps no state that needs the GIL. (Made here, not
	// imported, it would not turn the GIL back on anyway; this says so should that change.)
	PyUnstable_Module_SetGIL(native, Py_MOD_GIL_NOT_USED);
#endif
	PyObject *code = Py_CompileString(src, runtime_file, Py_file_input);
	if (!code) {
		set_init_error_from_python("compiling the runtime");
		return -1;
	}
	PyObject *mod = PyImport_AddModule("_minipy_runtime");  // borrowed
	PyObject *dict = mod ? PyModule_GetDict(mod) : NULL;
	// The builtins module, not PyEval_GetBuiltins (deprecated in 3.13; no frame runs yet).
	PyObject *builtins = dict ? PyImport_ImportModule("builtins") : NULL;
	int stored = builtins ? PyDict_SetItemString(dict, "__builtins__", builtins) : -1;
	Py_XDECREF(builtins);
	if (stored < 0) {
		set_init_error_from_python("creating _minipy_runtime");
		return -1;
	}
	PyObject *r = PyEval_EvalCode(code, dict, dict);
	Py_DECREF(code);
	if (!r) {
		set_init_error_from_python("loading the runtime");
		return -1;
	}
	Py_DECREF(r);
	PyObject *install = PyDict_GetItemString(dict, "install");
	mp.dispatch = install ? PyObject_CallFunction(install, "iOs", sig, native, executable) : NULL;
	mp.timeout_cls = PyDict_GetItemString(dict, "TimeoutInterrupt");
	if (!mp.dispatch || !mp.timeout_cls) {
		set_init_error_from_python("installing the runtime");
		return -1;
	}
	Py_INCREF(mp.timeout_cls);
	mp.runtime_file = PyUnicode_FromString(runtime_file);

	// install() registered the Python-level handler for sig (signal.signal, which is why this
	// must be the init thread); now take over the OS-level handler so that the signal only
	// trips Python while a run is armed.
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = kick_handler;
	sa.sa_flags = SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	if (sigaction(sig, &sa, NULL) != 0) {
		snprintf(mp.init_error, sizeof mp.init_error, "sigaction(%d): %s", sig, strerror(errno));
		return -1;
	}
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, sig);
	pthread_sigmask(SIG_UNBLOCK, &set, NULL);
	return 0;
}

int mp_init_wait(void) {
	for (;;) {
		uint32_t s = atomic_load(&mp.init_state);
		if (s != 0) {
			return s == 1;
		}
		futex_wait(&mp.init_state, 0, -1);
	}
}

const char *mp_init_error(void) { return mp.init_error; }

// ---- serving -------------------------------------------------------------------------

static void put_u32(char *p, uint32_t v) { memcpy(p, &v, 4); }

// An error response in runtime.py's format: status 1, then the list [kind, message].
static char *internal_error_response(const char *msg, size_t *len) {
	static const char kind[] = "internal";
	size_t kn = sizeof kind - 1, mn = strlen(msg);
	size_t n = 1 + 1 + 4 + (1 + 4 + kn) + (1 + 4 + mn);
	char *out = malloc(n), *p = out;
	*p++ = 1;
	*p++ = 'l';
	put_u32(p, 2), p += 4;
	*p++ = 's';
	put_u32(p, (uint32_t)kn), p += 4;
	memcpy(p, kind, kn), p += kn;
	*p++ = 's';
	put_u32(p, (uint32_t)mn), p += 4;
	memcpy(p, msg, mn);
	*len = n;
	return out;
}

static void run_request(void) {
	PyEval_RestoreThread(mp.ts);
	PyObject *arg = PyBytes_FromStringAndSize(mp.req, (Py_ssize_t)mp.req_len);
	free(mp.req);
	mp.req = NULL;
	PyObject *r = arg ? PyObject_CallOneArg(mp.dispatch, arg) : NULL;
	Py_XDECREF(arg);
	char *resp;
	size_t n;
	if (r && PyBytes_Check(r)) {
		n = (size_t)PyBytes_GET_SIZE(r);
		resp = malloc(n ? n : 1);
		memcpy(resp, PyBytes_AS_STRING(r), n);
	} else {
		set_init_error_from_python("dispatch");
		resp = internal_error_response(mp.init_error, &n);
		mp.init_error[0] = 0;
	}
	Py_XDECREF(r);

	// Disarm, then drain: a kick that landed after the run's code ended has tripped the
	// handler, which must run now (and do nothing) rather than in the next request.
	pthread_mutex_lock(&mp.mu);
	mp.running = 0;
	mp.armed = 0;
	int kicked = mp.kicked;
	pthread_mutex_unlock(&mp.mu);
	if (kicked) {
		for (int i = 0; i < 3; i++) {
			if (PyErr_CheckSignals() < 0) {
				PyErr_Clear();
			}
		}
		if (mp.hard_stop_on) {
			PyEval_SetTrace(NULL, NULL);
			mp.hard_stop_on = 0;
		}
		// An interrupt raised inside exception handling (a swallower's `with suppress`
		// stopped by the hard stage) can leave it as the thread's "exception being
		// handled" (3.11); with no Python frame running there is none, so reset it, or
		// the next run's errors would show it as their context.
#if PY_VERSION_HEX >= 0x030C0000
		PyErr_SetHandledException(NULL);
#else
		PyErr_SetExcInfo(NULL, NULL, NULL);
#endif
	}
	PyErr_Clear();
	mp.ts = PyEval_SaveThread();

	mp.resp = resp;
	mp.resp_len = n;
	mp.resp_kicked = kicked;
	atomic_store(&mp.done_gen, mp.req_gen);
	atomic_fetch_add(&mp.wake_seq, 1);
	if (atomic_load(&mp.callers_sleeping)) {
		futex_wake_all(&mp.wake_seq);
	}
}

void mp_serve(const char *src, const char *runtime_file, const char *executable, int sig) {
	mp.owner = pthread_self();
	mp.sig = sig;
	if (init_python(src, runtime_file, executable, sig) != 0) {
		atomic_store(&mp.init_state, 2);
		futex_wake_all(&mp.init_state);
		return;
	}
	// Read before announcing readiness: a request submitted right after must look new.
	uint32_t seen = atomic_load(&mp.job_seq);
	mp.ts = PyEval_SaveThread();  // the GIL is free between runs, so user threads run
	atomic_store(&mp.init_state, 1);
	futex_wake_all(&mp.init_state);

	for (;;) {
		int64_t spin_start = now_ns(), now = spin_start;
		while (atomic_load(&mp.job_seq) == seen && now < spin_start + OWNER_SPIN_NS) {
			cpu_relax(now - spin_start);
			now = now_ns();
		}
		while (atomic_load(&mp.job_seq) == seen) {
			atomic_store(&mp.owner_sleeping, 1);
			if (atomic_load(&mp.job_seq) == seen) {
				futex_wait(&mp.job_seq, seen, -1);
			}
			atomic_store(&mp.owner_sleeping, 0);
		}
		seen = atomic_load(&mp.job_seq);
		run_request();
	}
}

uint64_t mp_submit(char *req, size_t len, int host_calls) {
	pthread_mutex_lock(&mp.mu);
	uint64_t gen = ++mp.gen;
	mp.running = 1;
	mp.host_calls = host_calls;
	mp.kicked = 0;
	mp.stage = 0;
	mp.armed = 0;
	pthread_mutex_unlock(&mp.mu);
	events_reset();
	mp.req = req;
	mp.req_len = len;
	mp.req_gen = gen;
	atomic_fetch_add(&mp.job_seq, 1);
	if (atomic_load(&mp.owner_sleeping)) {
		futex_wake_all(&mp.job_seq);
	}
	return gen;
}

int mp_wait(uint64_t gen, int64_t timeout_ns, int events) {
	int64_t start = now_ns();
	int64_t deadline = timeout_ns < 0 ? INT64_MAX : start + timeout_ns;
	uint32_t wakes = atomic_load(&mp.wakes);
	uint32_t seq = atomic_load(&mp.wake_seq);
	int64_t spin_until = start + CALLER_SPIN_NS < deadline ? start + CALLER_SPIN_NS : deadline;
	for (int64_t now = start; atomic_load(&mp.done_gen) < gen && atomic_load(&mp.wake_seq) == seq &&
	                          !(events && atomic_load(&ev_pending)) && now < spin_until;
	     now = now_ns()) {
		cpu_relax(now - start);
	}
	for (;;) {
		if (atomic_load(&mp.done_gen) >= gen) {
			return 1;
		}
		if (events && atomic_load(&ev_pending)) {
			return 2;
		}
		if (atomic_load(&mp.wake_seq) != seq) {
			if (!events && atomic_load(&mp.wakes) == wakes) {
				seq = atomic_load(&mp.wake_seq);  // only an event: not what this wait is for
				continue;
			}
			return 0;  // mp_wake: let the caller look at its context
		}
		int64_t now = now_ns();
		if (now >= deadline) {
			return 0;
		}
		atomic_fetch_add(&mp.callers_sleeping, 1);
		if (atomic_load(&mp.done_gen) < gen && atomic_load(&mp.wake_seq) == seq && !atomic_load(&ev_pending)) {
			futex_wait(&mp.wake_seq, seq, deadline == INT64_MAX ? -1 : deadline - now);
		}
		atomic_fetch_sub(&mp.callers_sleeping, 1);
	}
}

void mp_wake(void) {
	atomic_fetch_add(&mp.wakes, 1);
	atomic_fetch_add(&mp.wake_seq, 1);
	futex_wake_all(&mp.wake_seq);
}

char *mp_take(uint64_t gen, size_t *len, int *kicked) {
	if (atomic_load(&mp.done_gen) != gen) {
		return NULL;
	}
	char *r = mp.resp;
	*len = mp.resp_len;
	*kicked = mp.resp_kicked;
	mp.resp = NULL;
	mp.resp_len = 0;
	return r;
}

const char *mp_libpython_file(void) {
	Dl_info info;
	if (dladdr((void *)&Py_Initialize, &info) == 0 || info.dli_fname == NULL) {
		return NULL;
	}
	return info.dli_fname;
}

// ---- the isolated engine's fork code (see cpython.h) ----------------------------------
//
// Its own section, so that its bytes are known (the section's size, in the executable's
// section headers: cpython.go's ForkCode) and hold nothing else (GCC splits no cold part
// of a function with a section of its own into another). One function: the helpers below
// are inlined into it.

#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

#ifndef SYS_open_tree  // (the generic table's numbers, the same on every 64-bit machine Go has)
#define SYS_open_tree 428
#endif
#ifndef SYS_move_mount
#define SYS_move_mount 429
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif

// No stack protector (its failure path calls out), and with GCC no memset or memcpy for a
// loop and no jump table (a call out, a table in .rodata). (GCC's optimize("no-stack-
// protector") is what works before GCC 11's no_stack_protector; clang has the attribute
// since 11. Loops that clang could turn into memset or strlen write and read through
// volatile pointers.)
#if defined(__clang__)
#if __has_attribute(no_stack_protector)
#define MP_CODE_ATTRS __attribute__((section("minipy_fork_code"), used, noinline, no_stack_protector))
#define MP_INLINE static inline __attribute__((always_inline, no_stack_protector))
#else
#define MP_CODE_ATTRS __attribute__((section("minipy_fork_code"), used, noinline))
#define MP_INLINE static inline __attribute__((always_inline))
#endif
#else
#define MP_CODE_OPTIMIZE optimize("Os", "no-stack-protector", "no-tree-loop-distribute-patterns", "no-jump-tables")
#define MP_CODE_ATTRS __attribute__((section("minipy_fork_code"), used, noinline, MP_CODE_OPTIMIZE))
#define MP_INLINE static inline __attribute__((always_inline, MP_CODE_OPTIMIZE))
#endif

typedef void (*mp_void_fn)(void);
typedef int (*mp_int_fn)(int);
typedef long (*mp_syscall_fn)(long, ...);

// A system call through the table's syscall: -1 and errno on failure.
#define MP_SYS(t, ...) (((mp_syscall_fn)(t)[MP_FT_SYSCALL])(__VA_ARGS__))

MP_INLINE int mp_errno(int64_t *t) {
	return *((int *(*)(void))t[MP_FT_ERRNO])();
}

MP_INLINE long mp_len(const char *s) {
	const volatile char *p = s;
	long n = 0;
	while (p[n]) {
		n++;
	}
	return n;
}

// mp_cat appends s to buf (n bytes long, at most cap) and returns the new length.
MP_INLINE int mp_cat(char *buf, int n, int cap, const char *s) {
	const volatile char *p = s;
	for (; p && *p && n < cap; p++) {
		buf[n++] = *p;
	}
	return n;
}

// mp_num appends v in decimal.
MP_INLINE int mp_num(char *buf, int n, int cap, long v) {
	char d[24];
	int k = 0;
	if (v < 0) {
		v = -v;
	}
	do {
		d[k++] = (char)('0' + v % 10);
		v /= 10;
	} while (v && k < 24);
	while (k && n < cap) {
		buf[n++] = d[--k];
	}
	return n;
}

// mp_say writes why the sandbox's set-up failed at step (MP_SS_*), errno err, to fd; mp_fail
// then exits 70, as sandbox.py's _become_tenant does.
MP_INLINE void mp_say(int64_t *t, long fd, int step, int err) {
	const char *const *why = (const char *const *)t[MP_FT_S_WHY];
	char buf[512];
	int n = mp_cat(buf, 0, 480, why[MP_SS_COUNT]);  // "minipy worker: ... failed: "
	n = mp_cat(buf, n, 480, why[step]);
	n = mp_cat(buf, n, 480, why[MP_SS_COUNT + 1]);  // ": [Errno "
	n = mp_num(buf, n, 500, err);
	buf[n++] = ']';
	if (err == EAGAIN) {
		n = mp_cat(buf, n, 500, why[MP_SS_COUNT + 2]);  // " (the host's process limit ...)"
	}
	buf[n++] = '\n';
	MP_SYS(t, SYS_write, fd, (long)buf, (long)n);
}

MP_INLINE void mp_fail(int64_t *t, long fd, int step) {
	mp_say(t, fd, step, mp_errno(t));
	((void (*)(int))t[MP_FT_EXIT])(70);
}

// mp_fd_path writes the fd's /proc/self/fd path into buf (64 bytes).
MP_INLINE char *mp_fd_path(int64_t *t, char *buf, long fd) {
	int n = mp_num(buf, mp_cat(buf, 0, 40, (const char *)t[MP_FT_S_FD_PATH]), 60, fd);
	buf[n] = 0;
	return buf;
}

MP_INLINE long mp_mount(int64_t *t, const char *src, const char *dst, const char *fs, long flags, const char *data) {
	return MP_SYS(t, SYS_mount, (long)src, (long)dst, (long)fs, flags, (long)data);
}

MP_INLINE long mp_open(int64_t *t, long dir, const char *path, long flags) {
	return MP_SYS(t, SYS_openat, dir, (long)path, flags | O_CLOEXEC, 0644L);
}

MP_INLINE void mp_close(int64_t *t, long fd) {
	MP_SYS(t, SYS_close, fd);
}

// mp_place makes the mount point path (a directory, or an empty file) and its parents, as
// sandbox.py's _Mounter.place; a failure shows in the mount that follows.
MP_INLINE void mp_place(int64_t *t, const char *path, int dir) {
	char p[1024];
	int n = mp_cat(p, 0, (int)sizeof p - 1, path);
	p[n] = 0;
	for (int i = 1; i < n; i++) {
		if (p[i] == '/') {
			p[i] = 0;
			MP_SYS(t, SYS_mkdirat, (long)AT_FDCWD, (long)p, 0777L);
			p[i] = '/';
		}
	}
	if (dir) {
		MP_SYS(t, SYS_mkdirat, (long)AT_FDCWD, (long)p, 0777L);
	} else {
		long fd = mp_open(t, AT_FDCWD, p, O_WRONLY | O_CREAT);
		if (fd >= 0) {
			mp_close(t, fd);
		}
	}
}

// mp_own_tree leaves the sandbox's tree alone at the engine's trees, in a mount namespace of
// its own, as sandbox.py's _own_tree (which says why).
MP_INLINE int mp_own_tree(int64_t *t) {
	const char *trees = (const char *)t[MP_FT_S_TREES];
	const long dir = O_PATH | O_DIRECTORY | O_NOFOLLOW;
	char empty = 0;
	if (MP_SYS(t, SYS_unshare, (long)CLONE_NEWNS) != 0) {
		return MP_SS_TREE_NS;
	}
	if (mp_mount(t, 0, trees, 0, MS_REC | MS_SLAVE, 0) != 0) {
		return MP_SS_TREE_SLAVE;
	}
	long all = mp_open(t, AT_FDCWD, trees, dir);
	long tree = all < 0 ? -1 : mp_open(t, all, (const char *)t[MP_FT_S_TREE], dir);
	if (tree < 0) {
		return MP_SS_TREE_OPEN;
	}
	mp_close(t, all);
	long copy = MP_SYS(t, SYS_open_tree, tree, (long)&empty, 0x1L | 0x8000 | 0x1000);  // OPEN_TREE_CLONE, AT_RECURSIVE, AT_EMPTY_PATH
	if (copy < 0) {
		return MP_SS_TREE_COPY;
	}
	mp_close(t, tree);
	if (MP_SYS(t, SYS_umount2, (long)trees, (long)MNT_DETACH) != 0) {
		return MP_SS_TREE_DETACH;
	}
	if (MP_SYS(t, SYS_move_mount, copy, (long)&empty, (long)AT_FDCWD, (long)trees, 4L) != 0) {  // MOVE_MOUNT_F_EMPTY_PATH
		return MP_SS_TREE_MOVE;
	}
	mp_close(t, copy);
	return -1;
}

// mp_send_fd sends fd over sock in a one-byte message (kind); sendmsg's result.
MP_INLINE long mp_send_fd(int64_t *t, long sock, unsigned char kind, long fd) {
	union {
		struct cmsghdr h;
		unsigned char space[CMSG_SPACE(sizeof(int))];
	} cm;
	struct iovec iov;
	iov.iov_base = &kind;
	iov.iov_len = 1;
	struct msghdr msg;
	msg.msg_name = 0;
	msg.msg_namelen = 0;
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = cm.space;
	msg.msg_controllen = sizeof cm.space;
	msg.msg_flags = 0;
	volatile struct cmsghdr *c = CMSG_FIRSTHDR(&msg);  // (volatile: stored, not loaded from .rodata)
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	int f = (int)fd;
	for (unsigned k = 0; k < sizeof f; k++) {
		CMSG_DATA(c)[k] = ((unsigned char *)&f)[k];
	}
	return MP_SYS(t, SYS_sendmsg, sock, (long)&msg, (long)MSG_NOSIGNAL);
}

// mp_loopback brings the loopback of the sandbox's own network namespace up, as
// sandbox.py's _loopback_up; -1 on failure.
MP_INLINE long mp_loopback(int64_t *t) {
	long s = MP_SYS(t, SYS_socket, (long)AF_INET, (long)(SOCK_DGRAM | SOCK_CLOEXEC), 0L);
	if (s < 0) {
		return -1;
	}
	struct ifreq ifr;
	volatile unsigned char *z = (volatile unsigned char *)&ifr;
	for (unsigned i = 0; i < sizeof ifr; i++) {
		z[i] = 0;
	}
	z[0] = 'l';  // ifr_name (GCC would load two constant bytes from .rodata)
	z[1] = 'o';
	if (MP_SYS(t, SYS_ioctl, s, (long)SIOCGIFFLAGS, (long)&ifr) != 0) {
		return -1;
	}
	ifr.ifr_flags |= IFF_UP;
	if (MP_SYS(t, SYS_ioctl, s, (long)SIOCSIFFLAGS, (long)&ifr) != 0) {
		return -1;
	}
	mp_close(t, s);
	return 0;
}

// mp_egress listens on 127.0.0.1:port (the loopback is up) and hands the listening socket
// to the host over the control socket, as sandbox.py's _egress_listener; -1 on failure.
MP_INLINE long mp_egress(int64_t *t, long port) {
	volatile unsigned char *z;
	long l = MP_SYS(t, SYS_socket, (long)AF_INET, (long)(SOCK_STREAM | SOCK_CLOEXEC), 0L);
	if (l < 0) {
		return -1;
	}
	struct sockaddr_in a;
	z = (volatile unsigned char *)&a;
	for (unsigned i = 0; i < sizeof a; i++) {
		z[i] = 0;
	}
	a.sin_family = AF_INET;
	unsigned char *pa = (unsigned char *)&a.sin_port, *ip = (unsigned char *)&a.sin_addr.s_addr;
	pa[0] = (unsigned char)(port >> 8);  // (network order, whatever the machine's)
	pa[1] = (unsigned char)port;
	ip[0] = 127;
	ip[3] = 1;
	if (MP_SYS(t, SYS_bind, l, (long)&a, (long)sizeof a) != 0 || MP_SYS(t, SYS_listen, l, 128L) != 0) {
		return -1;
	}
	if (mp_send_fd(t, t[MP_FT_S_FDS + 3], (unsigned char)t[MP_FT_S_LISTEN], l) != 1) {
		return -1;
	}
	mp_close(t, l);
	return 0;
}

// The helpers below return the step that failed (MP_SS_*), or -1.

// mp_sandbox_t is the template's fork (T): cgroups, its own tree, its user namespace and
// the rest; it forks the sandbox's pid 1 and returns in it.
MP_INLINE int mp_map_ids(int64_t *t, long proc, long pid, long ready);

MP_INLINE int mp_sandbox_t(int64_t *t) {
	if (MP_SYS(t, SYS_setsid) < 0) {  // out of the template's process group
		return MP_SS_SETSID;
	}
	for (int i = 0; i < t[MP_FT_S_NCG] && i < 2; i++) {  // before anything else: all of it counted there
		char zero = '0';
		if (MP_SYS(t, SYS_write, t[MP_FT_S_CG + i], (long)&zero, 1L) != 1) {
			return MP_SS_CGROUP;
		}
		mp_close(t, t[MP_FT_S_CG + i]);
	}
	int step = mp_own_tree(t);
	if (step >= 0) {
		return step;
	}
	if (t[MP_FT_S_USERNS] > 0) {
		// A sandbox with a root user: its namespaces are the template's user namespace's,
		// its pid 1 goes on in one of its own, whose ids this maps (mp_map_ids).
		if (MP_SYS(t, SYS_setns, t[MP_FT_S_USERNS], (long)CLONE_NEWUSER) != 0) {
			return MP_SS_USERNS;
		}
	} else {
		if (MP_SYS(t, SYS_unshare, (long)CLONE_NEWUSER) != 0) {
			return MP_SS_USERNS;
		}
		for (int i = 0; i < 3; i++) {  // setgroups, uid_map, gid_map
			const char *text = (const char *)t[MP_FT_S_MAPS + 2 * i + 1];
			long f = mp_open(t, AT_FDCWD, (const char *)t[MP_FT_S_MAPS + 2 * i], O_WRONLY);
			if (f < 0 || MP_SYS(t, SYS_write, f, (long)text, mp_len(text)) != mp_len(text)) {
				return MP_SS_MAPS;
			}
			mp_close(t, f);
		}
	}
	if (MP_SYS(t, SYS_unshare, t[MP_FT_S_UNSHARE]) != 0) {
		return MP_SS_UNSHARE;
	}
	if ((t[MP_FT_S_UNSHARE] & CLONE_NEWNET) && mp_loopback(t) != 0) {
		return MP_SS_EGRESS;
	}
	if ((t[MP_FT_S_UNSHARE] & CLONE_NEWNET) && t[MP_FT_S_USERNS] > 0) {
		// A root user binds below 1024, as root does (the network's namespace is not its
		// user namespace's, whose capabilities would let it): sandbox.py's _low_ports.
		char zero = '0';
		long f = mp_open(t, AT_FDCWD, (const char *)t[MP_FT_S_LOW_PORTS], O_WRONLY);
		if (f < 0 || MP_SYS(t, SYS_write, f, (long)&zero, 1L) != 1) {
			return MP_SS_EGRESS;
		}
		mp_close(t, f);
	}
	if (t[MP_FT_S_PORT] && mp_egress(t, t[MP_FT_S_PORT]) != 0) {
		return MP_SS_EGRESS;
	}
	int up[2] = {-1, -1}, down[2] = {-1, -1};
	long proc = -1;
	if (t[MP_FT_S_USERNS] > 0) {
		// (/proc opened before the fork: pid 1 mounts its own over it)
		proc = mp_open(t, AT_FDCWD, (const char *)t[MP_FT_S_PROC_DIR], O_PATH | O_DIRECTORY);
		if (proc < 0 || MP_SYS(t, SYS_pipe2, (long)up, (long)O_CLOEXEC) != 0 ||
		    MP_SYS(t, SYS_pipe2, (long)down, (long)O_CLOEXEC) != 0) {
			return MP_SS_FORK;
		}
	}
	long pid = ((int (*)(void))t[MP_FT_FORK])();
	if (pid < 0) {
		return MP_SS_FORK;
	}
	if (pid > 0) {
		if (proc >= 0) {
			mp_close(t, up[1]);
			mp_close(t, down[0]);
			if (mp_map_ids(t, proc, pid, up[0]) != 0) {
				return MP_SS_MAPS;  // (pid 1 sees the pipe end with its ids unmapped, and says nothing)
			}
		}
		((void (*)(int))t[MP_FT_EXIT])(0);  // the template reaps T and adopts its child (a subreaper); pid 1 reads the end of down
	}
	if (proc >= 0) {
		mp_close(t, proc);
		mp_close(t, up[0]);
		mp_close(t, down[1]);
		t[MP_FT_S_SYNC] = up[1];
		t[MP_FT_S_SYNC + 1] = down[0];
	}
	return -1;
}

// mp_map_ids writes the uid_map and gid_map of pid (pid 1 of a sandbox with a root user)
// under proc once it says, on ready, that it has unshared its user namespace: a map of more
// than one id needs CAP_SETUID and CAP_SETGID over the namespace's parent, the template's,
// which T holds and pid 1 no longer does.
MP_INLINE int mp_map_ids(int64_t *t, long proc, long pid, long ready) {
	char said, path[64];
	if (MP_SYS(t, SYS_read, ready, (long)&said, 1L) != 1) {
		return -1;
	}
	const char *text = (const char *)t[MP_FT_S_IDMAP];
	for (int i = 0; i < 2; i++) {
		int n = mp_num(path, 0, 40, pid);
		n = mp_cat(path, n, 60, (const char *)t[MP_FT_S_ID_FILES + i]);
		path[n] = 0;
		long f = mp_open(t, proc, path, O_WRONLY);
		if (f < 0 || MP_SYS(t, SYS_write, f, (long)text, mp_len(text)) != mp_len(text)) {
			return -1;
		}
		mp_close(t, f);
	}
	return 0;
}

// mp_boot_id gives the sandbox a boot id of its own, as sandbox.py's _own_boot_id (which
// says why): a random UUID in a file of the fresh /dev/shm, bound read-only over the
// host's, then unlinked.
MP_INLINE int mp_boot_id(int64_t *t) {
	const char *file = (const char *)t[MP_FT_S_BOOT_ID], *target = (const char *)t[MP_FT_S_BOOT_ID + 1];
	unsigned char r[16];
	char text[40];
	if (MP_SYS(t, SYS_getrandom, (long)r, 16L, 0L) != 16) {
		return MP_SS_BOOT_ID;
	}
	r[6] = (unsigned char)((r[6] & 0x0F) | 0x40);  // a random (version 4) UUID
	r[8] = (unsigned char)((r[8] & 0x3F) | 0x80);
	int n = 0;
	for (int i = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10) {
			text[n++] = '-';
		}
		for (int shift = 4; shift >= 0; shift -= 4) {
			int d = (r[i] >> shift) & 0xF;
			text[n++] = (char)(d < 10 ? '0' + d : 'a' + d - 10);
		}
	}
	text[n++] = '\n';
	long fd = MP_SYS(t, SYS_openat, (long)AT_FDCWD, (long)file, (long)(O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC),
	                 0444L);
	if (fd < 0) {
		return MP_SS_BOOT_ID;
	}
	long wrote = MP_SYS(t, SYS_write, fd, (long)text, (long)n);
	mp_close(t, fd);
	int failed = wrote != n || mp_mount(t, file, target, 0, MS_BIND, 0) != 0 ||
	             mp_mount(t, 0, target, 0, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, 0) != 0;
	if (MP_SYS(t, SYS_unlinkat, (long)AT_FDCWD, (long)file, 0L) != 0 || failed) {
		return MP_SS_BOOT_ID;
	}
	return -1;
}

// mp_root_names makes the names of a sandbox's own root in it (root, attached: the copies
// of what holds mounts moved in), as sandbox.py's _own_root; -1, or the step that failed.
MP_INLINE int mp_root_names(int64_t *t, long root) {
	const int64_t *kinds = (const int64_t *)t[MP_FT_S_ROOT_KINDS];
	const char *const *names = (const char *const *)t[MP_FT_S_ROOT_NAMES];
	const char *const *links = (const char *const *)t[MP_FT_S_ROOT_LINKS];
	char empty = 0;
	for (int i = 0; i < t[MP_FT_S_ROOT_N] && i < 64; i++) {
		const char *name = names[i] + 1;  // (relative to root; names[i] is the template's)
		long k = kinds[i], made;
		if (k == MP_RK_LINK) {
			made = MP_SYS(t, SYS_symlinkat, (long)links[i], root, (long)name);
		} else if (k == MP_RK_COPY_FILE) {
			made = mp_open(t, root, name, O_WRONLY | O_CREAT);
			if (made >= 0) {
				mp_close(t, made);
			}
		} else {
			made = MP_SYS(t, SYS_mkdirat, root, (long)name, 0755L);
		}
		if (made < 0 && made != -EEXIST) {
			return MP_SS_ROOT;
		}
		if (k == MP_RK_COPY_DIR || k == MP_RK_COPY_FILE) {
			long copy = MP_SYS(t, SYS_open_tree, (long)AT_FDCWD, (long)names[i], 0x1L | 0x8000 | O_CLOEXEC);  // OPEN_TREE_CLONE, AT_RECURSIVE
			if (copy < 0 || MP_SYS(t, SYS_move_mount, copy, (long)&empty, root, (long)name, 4L) != 0) {  // MOVE_MOUNT_F_EMPTY_PATH
				return MP_SS_ROOT;
			}
			mp_close(t, copy);
		}
	}
	return -1;
}

// mp_own_root gives the sandbox a root of its own, a tmpfs, and pivots into it, mounting its
// /proc on the way, as sandbox.py's _own_root (which says why); -1, or the step that failed.
MP_INLINE int mp_own_root(int64_t *t) {
	const char *const *opts = (const char *const *)t[MP_FT_S_ROOT_OPTS];
	const char *proc = (const char *)t[MP_FT_S_PROC];
	char empty = 0, dot[2] = {'.', 0};
	long fs = MP_SYS(t, SYS_fsopen, (long)t[MP_FT_S_TMPFS], 1L);  // FSOPEN_CLOEXEC
	if (fs < 0) {
		return MP_SS_ROOT;
	}
	for (int i = 0; i < 4; i += 2) {
		if (MP_SYS(t, SYS_fsconfig, fs, 1L, (long)opts[i], (long)opts[i + 1], 0L) != 0) {  // FSCONFIG_SET_STRING
			return MP_SS_ROOT;
		}
	}
	if (MP_SYS(t, SYS_fsconfig, fs, 6L, 0L, 0L, 0L) != 0) {  // FSCONFIG_CMD_CREATE
		return MP_SS_ROOT;
	}
	long root = MP_SYS(t, SYS_fsmount, fs, 1L, 0x2L | 0x4);  // FSMOUNT_CLOEXEC; MOUNT_ATTR_NOSUID, NODEV
	mp_close(t, fs);
	if (root < 0 || MP_SYS(t, SYS_move_mount, root, (long)&empty, (long)AT_FDCWD, t[MP_FT_S_ROOT_AT], 4L) != 0) {
		return MP_SS_ROOT;
	}
	int step = mp_root_names(t, root);
	if (step >= 0) {
		return step;
	}
	if (mp_mount(t, proc, (const char *)t[MP_FT_S_ROOT_PROC], proc, MS_NOSUID | MS_NODEV | MS_NOEXEC, 0) != 0) {
		return MP_SS_PROC;
	}
	if (MP_SYS(t, SYS_fchdir, root) != 0 || MP_SYS(t, SYS_pivot_root, (long)dot, (long)dot) != 0 ||
	    MP_SYS(t, SYS_umount2, (long)dot, (long)MNT_DETACH) != 0) {
		return MP_SS_ROOT;
	}
	mp_close(t, root);
	char slash[2] = {'/', 0};
	return MP_SYS(t, SYS_chdir, (long)slash) != 0 ? MP_SS_ROOT : -1;
}

// mp_sandbox_mounts is pid 1's file system, as sandbox.py's _tenant_mounts (which says why).
MP_INLINE int mp_sandbox_mounts(int64_t *t) {
	const char *const *covered = (const char *const *)t[MP_FT_S_COVERED];
	const int64_t *covered_dir = (const int64_t *)t[MP_FT_S_COVERED_DIR];
	const long dir = O_PATH | O_DIRECTORY | O_NOFOLLOW;
	char path[64], empty = 0;
	long held[16];
	int n = (int)t[MP_FT_S_NCOVERED];
	for (int i = 0; i < n && i < 16; i++) {
		held[i] = MP_SYS(t, SYS_open_tree, (long)AT_FDCWD, (long)covered[i], 0x1L | 0x8000 | O_CLOEXEC);  // OPEN_TREE_CLONE, AT_RECURSIVE
		if (held[i] < 0) {
			return MP_SS_COVERED;
		}
	}
	int step = mp_own_root(t);
	if (step >= 0) {
		return step;
	}
	long tree = mp_open(t, AT_FDCWD, (const char *)t[MP_FT_S_TREES], dir);
	long home = tree < 0 ? -1 : mp_open(t, tree, (const char *)t[MP_FT_S_HOME], dir);
	if (home < 0) {
		return MP_SS_HOME;
	}
	mp_close(t, tree);
	if (mp_mount(t, mp_fd_path(t, path, home), (const char *)t[MP_FT_S_WORKDIR], 0, MS_BIND, 0) != 0) {
		return MP_SS_BIND_HOME;
	}
	mp_close(t, home);
	const char *tmpfs = (const char *)t[MP_FT_S_TMPFS];
	for (int i = 0; i < 2; i++) {
		if (mp_mount(t, tmpfs, (const char *)t[MP_FT_S_TMP_DIRS + i], tmpfs, MS_NOSUID | MS_NODEV,
		             (const char *)t[MP_FT_S_TMP_DATA]) != 0) {
			return MP_SS_TMPFS;
		}
	}
	for (int i = 0; i < n && i < 16; i++) {
		mp_place(t, covered[i], (int)covered_dir[i]);
		if (MP_SYS(t, SYS_move_mount, held[i], (long)&empty, (long)AT_FDCWD, (long)covered[i], 4L) != 0) {  // MOVE_MOUNT_F_EMPTY_PATH
			return MP_SS_COVERED;
		}
		mp_close(t, held[i]);
	}
	return mp_boot_id(t);
}

// mp_sandbox_fds takes the six fds as 0-5 (0-2 inherited by what pid 1 execs, as the
// worker's are) and closes every other; *err_fd follows the new stderr.
MP_INLINE int mp_sandbox_fds(int64_t *t, long *err_fd) {
	long high[6];
	for (int i = 0; i < 6; i++) {
		high[i] = MP_SYS(t, SYS_fcntl, t[MP_FT_S_FDS + i], (long)F_DUPFD_CLOEXEC, 10L);  // none is clobbered below
		if (high[i] < 0) {
			return MP_SS_FDS;
		}
	}
	for (int i = 0; i < 6; i++) {
		mp_close(t, t[MP_FT_S_FDS + i]);
	}
	*err_fd = high[2];
	for (int i = 0; i < 6; i++) {
		if (MP_SYS(t, SYS_dup3, high[i], (long)i, (long)(i < 3 ? 0 : O_CLOEXEC)) != i) {
			return MP_SS_FDS;
		}
	}
	*err_fd = 2;
	for (int i = 0; i < 6; i++) {
		mp_close(t, high[i]);
	}
	long first = t[MP_FT_S_LIFE] + 1;
	if (MP_SYS(t, SYS_close_range, first, (long)~0U, 0L) != 0) {  // (before Linux 5.9: one by one)
		struct rlimit lim;
		long top = MP_SYS(t, SYS_prlimit64, 0L, (long)RLIMIT_NOFILE, 0L, (long)&lim) == 0 ? (long)lim.rlim_cur : 1024;
		for (long fd = first; fd < top && fd < (1L << 20); fd++) {
			mp_close(t, fd);
		}
	}
	return -1;
}

// mp_root_user makes pid 1 of a sandbox with a root user, its mounts made, what
// sandbox.py's _root_user says: in a user namespace of its own whose ids T maps
// (mp_map_ids), root's home root's, every capability of that namespace ambient, so that its
// processes may become its root (head and data: capget's and capset's buffers).
MP_INLINE int mp_root_user(int64_t *t, unsigned int *head, unsigned int *data) {
	char go = 1;
	if (MP_SYS(t, SYS_unshare, (long)CLONE_NEWUSER) != 0) {
		return MP_SS_USERNS;
	}
	if (MP_SYS(t, SYS_write, t[MP_FT_S_SYNC], (long)&go, 1L) != 1) {
		return MP_SS_MAPS;
	}
	MP_SYS(t, SYS_read, t[MP_FT_S_SYNC + 1], (long)&go, 1L);  // its end: T has written the maps, or failed
	mp_close(t, t[MP_FT_S_SYNC]);
	mp_close(t, t[MP_FT_S_SYNC + 1]);
	// Root's home made root's: what fails while the ids are unmapped (0 is not mapped).
	const char *home = (const char *)t[MP_FT_S_ROOT_HOME];
	if (MP_SYS(t, SYS_fchownat, (long)AT_FDCWD, (long)home, 0L, 0L, (long)AT_SYMLINK_NOFOLLOW) != 0 ||
	    MP_SYS(t, SYS_fchmodat, (long)AT_FDCWD, (long)home, 0700L) != 0) {
		return MP_SS_ROOT_HOME;
	}
	if (MP_SYS(t, SYS_capget, (long)head, (long)data) != 0) {
		return MP_SS_CAPS;
	}
	data[2] = data[1];  // inheritable = permitted (every one: the namespace's creator), as ambient needs
	data[5] = data[4];
	if (MP_SYS(t, SYS_capset, (long)head, (long)data) != 0) {
		return MP_SS_CAPS;
	}
	for (long cap = 0; cap <= t[MP_FT_S_CAP_LAST]; cap++) {
		if (MP_SYS(t, SYS_prctl, (long)PR_CAP_AMBIENT, (long)PR_CAP_AMBIENT_RAISE, cap, 0L, 0L) != 0) {
			return MP_SS_CAPS;
		}
	}
	return -1;
}

// mp_sandbox_p1 is the sandbox's pid 1 until it runs Python.
MP_INLINE int mp_sandbox_p1(int64_t *t, long *err_fd) {
	const char *host = (const char *)t[MP_FT_S_HOSTNAME];
	if (MP_SYS(t, SYS_sethostname, (long)host, mp_len(host)) != 0) {
		return MP_SS_HOSTNAME;
	}
	int step = mp_sandbox_mounts(t);
	if (step >= 0) {
		return step;
	}
	unsigned int head[2], data[6];
	((volatile unsigned int *)head)[0] = 0x20080522;  // _LINUX_CAPABILITY_VERSION_3
	((volatile unsigned int *)head)[1] = 0;
	for (int i = 0; i < 6; i++) {
		((volatile unsigned int *)data)[i] = 0;
	}
	if (t[MP_FT_S_USERNS] > 0) {
		step = mp_root_user(t, head, data);
		if (step >= 0) {
			return step;
		}
	} else if (MP_SYS(t, SYS_prctl, (long)PR_CAP_AMBIENT, (long)PR_CAP_AMBIENT_CLEAR_ALL, 0L, 0L, 0L) != 0 ||
	           MP_SYS(t, SYS_capset, (long)head, (long)data) != 0) {
		return MP_SS_CAPS;
	}
	if (MP_SYS(t, SYS_prctl, (long)PR_SET_NO_NEW_PRIVS, 1L, 0L, 0L, 0L) != 0) {
		return MP_SS_CAPS;
	}
	if (MP_SYS(t, SYS_prctl, (long)PR_SET_SECCOMP, 2L, t[MP_FT_S_FILTER], 0L, 0L) != 0) {  // SECCOMP_MODE_FILTER
		return MP_SS_SECCOMP;
	}
	return mp_sandbox_fds(t, err_fd);
}

// mp_sigaction sets sig's disposition to SIG_DFL (0) or SIG_IGN (1) (the kernel's struct
// sigaction: handler, flags, restorer, mask; no handler runs, so no restorer).
MP_INLINE void mp_sigaction(int64_t *t, long sig, long disposition) {
	unsigned long act[4];
	volatile unsigned long *a = act;
	a[0] = (unsigned long)disposition;
	a[1] = a[2] = a[3] = 0;
	MP_SYS(t, SYS_rt_sigaction, sig, (long)act, 0L, 8L);
}

// mp_recv reads the next message on fd into buf (at most cap bytes), without waiting and
// without its fds (a message that carries some has MSG_CTRUNC in *flags; how MSG_PEEK: it
// stays, and none is made); the message's length, 0 at the socket's end, or -1.
MP_INLINE long mp_recv(int64_t *t, long fd, unsigned char *buf, long cap, long how, int *flags) {
	struct iovec iov;
	iov.iov_base = buf;
	iov.iov_len = (size_t)cap;
	struct msghdr msg;
	msg.msg_name = 0;
	msg.msg_namelen = 0;
	msg.msg_iov = &iov;
	msg.msg_iovlen = 1;
	msg.msg_control = 0;
	msg.msg_controllen = 0;
	msg.msg_flags = 0;
	long got = MP_SYS(t, SYS_recvmsg, fd, (long)&msg, how | MSG_DONTWAIT);
	*flags = msg.msg_flags;
	return got;
}

MP_INLINE uint32_t mp_u32(const unsigned char *p) {  // little-endian, as struct's "<I"
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// mp_oom_score gives the snapshot pid the guardian's OOM score (guardian.py's
// give_snapshot_oom_score, which says why); *oom holds the score once read (n: its length,
// -1 before). Best effort.
MP_INLINE void mp_oom_score(int64_t *t, long pid, char *oom, long *n) {
	if (*n < 0) {
		*n = 0;
		long f = mp_open(t, AT_FDCWD, (const char *)t[MP_FT_G_OOM_SELF], O_RDONLY);
		if (f >= 0) {
			long got = MP_SYS(t, SYS_read, f, (long)oom, 15L);
			mp_close(t, f);
			for (*n = got > 0 ? got : 0; *n > 0 && (oom[*n - 1] == '\n' || oom[*n - 1] == ' '); --*n) {
			}
		}
	}
	if (*n == 0) {
		return;
	}
	char path[64];
	int k = mp_cat(path, 0, 20, (const char *)t[MP_FT_G_OOM_PID]);
	k = mp_num(path, k, 40, pid);
	k = mp_cat(path, k, 62, (const char *)t[MP_FT_G_OOM_PID + 1]);
	path[k] = 0;
	long f = mp_open(t, AT_FDCWD, path, O_WRONLY);
	if (f >= 0) {
		MP_SYS(t, SYS_write, f, (long)oom, *n);
		mp_close(t, f);
	}
}

// mp_guard is the guardian's loop while it stays in C (cpython.h): it returns when
// something needs guardian.py's _Guardian, left unread for it. sfd is a signalfd of SIGCHLD.
MP_INLINE void mp_guard(int64_t *t, long sfd) {
	const long ctl = t[MP_FT_G_CTL], v = t[MP_FT_G_V];
	char oom[16];
	long noom = -1;
	for (;;) {
		for (;;) {  // the children that ended (snapshots, orphans), but the worker: _Guardian's
			siginfo_t si;
			((volatile siginfo_t *)&si)->si_pid = 0;
			if (MP_SYS(t, SYS_waitid, (long)P_ALL, 0L, (long)&si, (long)(WEXITED | WNOHANG | WNOWAIT), 0L) != 0 ||
			    si.si_pid == 0) {
				break;
			}
			if (si.si_pid == t[MP_FT_G_WORKER]) {
				return;
			}
			MP_SYS(t, SYS_wait4, (long)si.si_pid, 0L, (long)WNOHANG, 0L);
			if (si.si_pid == t[MP_FT_G_SNAP]) {
				t[MP_FT_G_SNAP] = 0;
			}
		}
		struct pollfd p[3];
		volatile struct pollfd *vp = p;
		vp[0].fd = (int)sfd;
		vp[1].fd = (int)ctl;
		vp[2].fd = (int)v;
		for (int i = 0; i < 3; i++) {
			vp[i].events = POLLIN;
			vp[i].revents = 0;
		}
		if (MP_SYS(t, SYS_ppoll, (long)p, 3L, 0L, 0L, 0L) < 0) {
			if (mp_errno(t) == EINTR) {
				continue;
			}
			return;
		}
		if (p[0].revents) {
			unsigned char info[128];
			while (MP_SYS(t, SYS_read, sfd, (long)info, 128L) > 0) {
			}
		}
		unsigned char m[16];
		int flags;
		if (p[1].revents) {
			long got = mp_recv(t, ctl, m, 1, MSG_PEEK, &flags);
			if (got == 0) {
				((void (*)(int))t[MP_FT_EXIT])(0);  // the host is done with the sandbox, or gone: the kernel kills the rest
			}
			if (got > 0 || mp_errno(t) != EAGAIN) {
				return;
			}
		}
		if (p[2].revents) {
			long got = mp_recv(t, v, m, sizeof m, MSG_PEEK, &flags);
			if (got < 0 && mp_errno(t) == EAGAIN) {
				continue;
			}
			if (got != 10 || m[0] != (unsigned char)t[MP_FT_G_REPORT] || (flags & (MSG_TRUNC | MSG_CTRUNC))) {
				return;
			}
			mp_recv(t, v, m, sizeof m, 0, &flags);
			t[MP_FT_G_SNAP] = mp_u32(m + 1);
			t[MP_FT_G_GEN] = mp_u32(m + 5);
			if (t[MP_FT_G_SNAP]) {
				mp_oom_score(t, t[MP_FT_G_SNAP], oom, &noom);
			}
			if (m[9]) {  // the snapshot it replaces had died while it waited: the host counts it
				unsigned char died = (unsigned char)t[MP_FT_G_SNAP_DIED];
				MP_SYS(t, SYS_sendto, ctl, (long)&died, 1L, (long)MSG_NOSIGNAL, 0L, 0L);
			}
		}
	}
}

// mp_guardian forks the worker from the sandbox's pid 1 (the worker returns at once) and
// guards it in C until it hands over (cpython.h); the step that failed, or -1.
MP_INLINE int mp_guardian(int64_t *t) {
	int pair[2];
	unsigned long chld = 1UL << (SIGCHLD - 1), old = 0;
	if (MP_SYS(t, SYS_socketpair, (long)AF_UNIX, (long)(SOCK_SEQPACKET | SOCK_CLOEXEC), 0L, (long)pair) != 0 ||
	    MP_SYS(t, SYS_rt_sigprocmask, (long)SIG_BLOCK, (long)&chld, (long)&old, 8L) != 0) {
		return MP_SS_GUARDIAN;
	}
	long sfd = MP_SYS(t, SYS_signalfd4, -1L, (long)&chld, 8L, (long)(O_CLOEXEC | O_NONBLOCK));
	int pid = sfd < 0 ? -1 : ((int (*)(void))t[MP_FT_FORK])();
	if (pid < 0) {
		return MP_SS_GUARDIAN;
	}
	if (pid == 0) {  // the worker
		MP_SYS(t, SYS_rt_sigprocmask, (long)SIG_SETMASK, (long)&old, 0L, 8L);
		mp_close(t, sfd);
		mp_close(t, pair[0]);
		mp_close(t, t[MP_FT_G_CTL]);  // the guardian's
		mp_close(t, t[MP_FT_S_LIFE]);  // the guardian's: the host sees it close when the guardian exits
		t[MP_FT_G_WORKER] = 0;
		t[MP_FT_G_V] = pair[1];
		return -1;
	}
	mp_close(t, pair[1]);
	// Out of the code's reach (guardian.py's _out_of_reach, which says why).
	if (MP_SYS(t, SYS_prctl, (long)PR_SET_DUMPABLE, 0L, 0L, 0L, 0L) != 0) {
		return MP_SS_DUMPABLE;
	}
	mp_sigaction(t, SIGINT, 1L);
	mp_close(t, t[MP_FT_G_KICK]);  // the worker's
	t[MP_FT_G_WORKER] = pid;
	t[MP_FT_G_V] = pair[0];
	t[MP_FT_G_SNAP] = t[MP_FT_G_GEN] = 0;
	mp_guard(t, sfd);
	// Handed over: SIGCHLD back as _Guardian expects it (its default flushes one pending; it
	// reaps before it waits), and the signalfd gone.
	mp_sigaction(t, SIGCHLD, 0L);
	MP_SYS(t, SYS_rt_sigprocmask, (long)SIG_SETMASK, (long)&old, 0L, 8L);
	mp_close(t, sfd);
	return -1;
}

// ---- the template's loop (MP_OP_TEMPLATE) ----

// mp_name_ok says whether s is one path component, as template.py's _check_names wants.
MP_INLINE int mp_name_ok(const unsigned char *s) {
	if (!s[0] || (s[0] == '.' && (!s[1] || (s[1] == '.' && !s[2])))) {
		return 0;
	}
	for (; *s; s++) {
		if (*s == '/') {
			return 0;
		}
	}
	return 1;
}

// mp_fields splits m[0:n] at its NULs into up to k C strings (m[n] is writable); how many.
MP_INLINE int mp_fields(unsigned char *m, long n, unsigned char **f, int k) {
	int got = 0;
	m[n] = 0;
	f[got++] = m;
	for (long i = 0; i < n; i++) {
		if (!m[i]) {
			if (got == k) {
				return k + 1;
			}
			f[got++] = m + i + 1;
		}
	}
	return got;
}

MP_INLINE long mp_dev(int64_t *t, long fd, unsigned long *dev) {
	struct stat st;
	if (MP_SYS(t, SYS_fstat, fd, (long)&st) != 0) {
		return -1;
	}
	*dev = (unsigned long)st.st_dev;
	return 0;
}

// mp_tmpfs mounts a tmpfs of size bytes over fd (template.py's _tree_root and _mount_home,
// which say why), with the options data (up to the size).
MP_INLINE long mp_tmpfs(int64_t *t, long fd, const char *data, long size) {
	char path[64], opts[256];
	int n = mp_cat(opts, 0, 200, data);
	n = mp_num(opts, n, 230, size);
	n = mp_cat(opts, n, 240, (const char *)t[MP_FT_T_DATA + 2]);
	n = mp_num(opts, n, 255, size >> 12 > 1024 ? size >> 12 : 1024);
	opts[n] = 0;
	const char *fs = (const char *)t[MP_FT_S_TMPFS];
	return mp_mount(t, fs, mp_fd_path(t, path, fd), fs, MS_NOSUID | MS_NODEV, opts);
}

// mp_workdir_mount does what template.py's _mount_workdir does for a message b"TREE\0NAME\0SIZE":
// the fd of the tmpfs's root to send; -2 when it moved while it was mounted; -1 when it
// leaves the message to template.py (nothing mounted: a bad name or size, a directory not
// there, a refusal; template.py does the same again and says why).
MP_INLINE long mp_workdir_mount(int64_t *t, unsigned char *m, long n) {
	unsigned char *f[3];
	if (mp_fields(m, n, f, 3) != 3 || !mp_name_ok(f[0]) || (f[1][0] && !mp_name_ok(f[1])) || !f[2][0]) {
		return -1;
	}
	long size = 0;
	for (unsigned char *d = f[2]; *d; d++) {
		if (*d < '0' || *d > '9' || d - f[2] > 17) {
			return -1;
		}
		size = size * 10 + (*d - '0');
	}
	if (size <= 0) {
		return -1;
	}
	const long dir = O_PATH | O_DIRECTORY | O_NOFOLLOW;
	unsigned long trees_dev, dev, root_dev;
	long trees = mp_open(t, AT_FDCWD, (const char *)t[MP_FT_S_TREES], dir);
	long tree = trees < 0 ? -1 : mp_open(t, trees, (const char *)f[0], dir);
	long r = -1, root = -1;
	if (tree < 0 || mp_dev(t, trees, &trees_dev) != 0 || mp_dev(t, tree, &dev) != 0) {
		goto out;
	}
	if (!f[1][0]) {  // the tree's own tmpfs
		if (dev != trees_dev) {
			r = MP_SYS(t, SYS_fcntl, tree, (long)F_DUPFD_CLOEXEC, 0L);  // mounted already
			goto out;
		}
		if (mp_tmpfs(t, tree, (const char *)t[MP_FT_T_DATA], size) != 0) {
			goto out;
		}
		root = mp_open(t, trees, (const char *)f[0], dir);  // a lookup by name enters the mount
		dev = trees_dev;
	} else {  // a working directory's, in the tree's
		long d = dev == trees_dev ? -1 : mp_open(t, tree, (const char *)f[1], dir);
		if (d < 0 || mp_dev(t, d, &dev) != 0 || mp_tmpfs(t, d, (const char *)t[MP_FT_T_DATA + 1], size) != 0) {
			if (d >= 0) {
				mp_close(t, d);
			}
			goto out;
		}
		mp_close(t, d);
		root = mp_open(t, tree, (const char *)f[1], dir);
	}
	r = -2;
	if (root >= 0 && mp_dev(t, root, &root_dev) == 0 && root_dev != dev) {
		r = root;
	} else if (root >= 0) {
		mp_close(t, root);
	}
out:
	if (tree >= 0) {
		mp_close(t, tree);
	}
	if (trees >= 0) {
		mp_close(t, trees);
	}
	return r;
}

// mp_template_next serves the template's control socket until the host asks for a new
// sandbox (1: its fds in the table, its names in names, 512 bytes), or something needs
// template.py (0: left unread).
MP_INLINE int mp_template_next(int64_t *t, unsigned char *names) {
	const long ctl = t[MP_FT_G_CTL], sfd = t[MP_FT_T_SFD];
	for (;;) {
		while (MP_SYS(t, SYS_wait4, -1L, 0L, (long)WNOHANG, 0L) > 0) {  // the forks (T), the sandboxes' pid 1s
		}
		struct pollfd p[2];
		volatile struct pollfd *vp = p;
		vp[0].fd = (int)sfd;
		vp[1].fd = (int)ctl;
		vp[0].events = vp[1].events = POLLIN;
		vp[0].revents = vp[1].revents = 0;
		if (MP_SYS(t, SYS_ppoll, (long)p, 2L, 0L, 0L, 0L) < 0) {
			if (mp_errno(t) == EINTR) {
				continue;
			}
			return 0;
		}
		if (p[0].revents) {
			unsigned char info[128];
			while (MP_SYS(t, SYS_read, sfd, (long)info, 128L) > 0) {
			}
		}
		if (!p[1].revents) {
			continue;
		}
		unsigned char m[512];
		int flags;
		long got = mp_recv(t, ctl, m, sizeof m - 1, MSG_PEEK, &flags);
		if (got < 0 && mp_errno(t) == EAGAIN) {
			continue;
		}
		if (got <= 1 || (flags & MSG_TRUNC)) {
			return 0;
		}
		if (m[0] == (unsigned char)t[MP_FT_T_MOUNT] && !(flags & MSG_CTRUNC)) {
			long root = mp_workdir_mount(t, m + 1, got - 1);
			if (root == -1) {
				return 0;
			}
			mp_recv(t, ctl, m, sizeof m - 1, 0, &flags);  // (taken only now: template.py reads what is left)
			if (root >= 0) {
				mp_send_fd(t, ctl, (unsigned char)t[MP_FT_T_MOUNT], root);
				mp_close(t, root);
			} else {
				unsigned char no[128];
				int k = mp_cat((char *)no, 1, 120, (const char *)t[MP_FT_T_MOVED]);
				no[0] = (unsigned char)t[MP_FT_T_REFUSED];
				MP_SYS(t, SYS_sendto, ctl, (long)no, (long)k, (long)MSG_NOSIGNAL, 0L, 0L);
			}
			continue;
		}
		unsigned char *f[2] = {m, m};
		if (m[0] != (unsigned char)t[MP_FT_T_NEW] || mp_fields(m + 1, got - 1, f, 2) != 2 || !mp_name_ok(f[0]) ||
		    !mp_name_ok(f[1])) {
			return 0;
		}
		// Taken, with its fds: six, then the cgroup.procs (at most two).
		union {
			struct cmsghdr h;
			unsigned char space[CMSG_SPACE(8 * sizeof(int))];
		} cm;
		struct iovec iov;
		iov.iov_base = names;
		iov.iov_len = 511;
		struct msghdr msg;
		msg.msg_name = 0;
		msg.msg_namelen = 0;
		msg.msg_iov = &iov;
		msg.msg_iovlen = 1;
		msg.msg_control = cm.space;
		msg.msg_controllen = sizeof cm.space;
		msg.msg_flags = 0;
		got = MP_SYS(t, SYS_recvmsg, ctl, (long)&msg, (long)(MSG_DONTWAIT | MSG_CMSG_CLOEXEC));
		int nfds = 0;
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		if (got > 0 && c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(0)) {
			nfds = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			const unsigned char *d = CMSG_DATA(c);
			for (int i = 0; i < nfds && i < 8; i++) {
				int fd = 0;
				for (unsigned k = 0; k < sizeof fd; k++) {
					((unsigned char *)&fd)[k] = d[i * sizeof fd + k];
				}
				t[i < 6 ? MP_FT_S_FDS + i : MP_FT_S_CG + i - 6] = fd;
			}
		}
		if (nfds < 6 || got <= 1) {
			for (int i = 0; i < nfds && i < 8; i++) {
				mp_close(t, t[i < 6 ? MP_FT_S_FDS + i : MP_FT_S_CG + i - 6]);
			}
			continue;  // (refused, as template.py does: the host's reads end)
		}
		mp_fields(names + 1, got - 1, f, 2);
		t[MP_FT_S_NCG] = nfds - 6;
		t[MP_FT_S_TREE] = (int64_t)f[0];
		t[MP_FT_S_HOME] = (int64_t)f[1];
		return 1;
	}
}

// mp_sandbox forks a new sandbox from the template (see cpython.h).
MP_INLINE long mp_sandbox(int64_t *t, int loop) {
	((mp_void_fn)t[MP_FT_BEFORE_FORK])();
	int pid = ((int (*)(void))t[MP_FT_FORK])();
	if (pid != 0) {
		int err = mp_errno(t);
		((mp_void_fn)t[MP_FT_AFTER_PARENT])();
		return pid > 0 ? pid : -err;
	}
	if (loop) {
		MP_SYS(t, SYS_rt_sigprocmask, (long)SIG_SETMASK, (long)&t[MP_FT_T_MASK], 0L, 8L);
	}
	long err_fd = t[MP_FT_S_FDS + 2];
	int step = mp_sandbox_t(t);
	if (step < 0) {
		step = mp_sandbox_p1(t, &err_fd);
	}
	if (step < 0) {
		step = mp_guardian(t);
	}
	if (step >= 0) {
		mp_fail(t, err_fd, step);
	}
	((mp_void_fn)t[MP_FT_AFTER_CHILD])();
	return 0;
}

MP_INLINE long mp_snapshot(int64_t *t) {
	((mp_void_fn)t[MP_FT_BEFORE_FORK])();
	int pid = ((int (*)(void))t[MP_FT_FORK])();
	if (pid != 0) {
		int err = *((int *(*)(void))t[MP_FT_ERRNO])();
		((mp_void_fn)t[MP_FT_AFTER_PARENT])();
		return pid > 0 ? pid : -err;
	}
	// The snapshot: C only until it takes over, so that the pages it writes are few (its
	// stack's, the message's): each is a copy-on-write fault. CPython's after-fork work
	// (thread states, locks, the at-fork hooks in Python) waits for the take-over.
	int n = (int)t[MP_FT_NCLOSE];
	for (int i = 0; i < n && i < 8; i++) {
		((mp_int_fn)t[MP_FT_CLOSE])((int)t[MP_FT_CLOSE_FDS + i]);
	}
	int sock = (int)t[MP_FT_SOCK], want = (int)t[MP_FT_WANT];
	for (;;) {
		unsigned char buf[256];
		union {
			struct cmsghdr h;
			unsigned char space[CMSG_SPACE(8 * sizeof(int))];
		} cm;
		struct iovec iov;
		iov.iov_base = buf;
		iov.iov_len = sizeof buf;
		struct msghdr msg;
		msg.msg_name = 0;
		msg.msg_namelen = 0;
		msg.msg_iov = &iov;
		msg.msg_iovlen = 1;
		msg.msg_control = cm.space;
		msg.msg_controllen = sizeof cm.space;
		msg.msg_flags = 0;
		long got = ((long (*)(int, struct msghdr *, int))t[MP_FT_RECVMSG])(sock, &msg, 0);
		if (got < 0 && *((int *(*)(void))t[MP_FT_ERRNO])() == EINTR) {
			continue;
		}
		if (got <= 0) {
			((void (*)(int))t[MP_FT_EXIT])(0);  // the guardian is gone: nothing to take over
		}
		// One SCM_RIGHTS message is all the guardian sends (CMSG_NXTHDR is a call).
		int nfds = 0;
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(0)) {
			nfds = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			const unsigned char *d = CMSG_DATA(c);
			for (int i = 0; i < nfds && i < 8; i++) {
				int fd = 0;
				for (unsigned k = 0; k < sizeof fd; k++) {
					((unsigned char *)&fd)[k] = d[i * sizeof fd + k];
				}
				t[MP_FT_FDS + i] = fd;
			}
		}
		if (buf[0] == (unsigned char)t[MP_FT_KIND] && nfds == want) {
			break;
		}
		for (int i = 0; i < nfds && i < 8; i++) {
			((mp_int_fn)t[MP_FT_CLOSE])((int)t[MP_FT_FDS + i]);
		}
	}
	((mp_void_fn)t[MP_FT_AFTER_CHILD])();
	return 0;
}

// ---- a local worker's loop (MP_OP_SERVE) ----

// The loop's steps return MP_W_OK, MP_W_END (the request pipe's end), MP_W_PY_ERROR (Python's
// error set), or -errno.
enum { MP_W_OK, MP_W_END = 1 << 20, MP_W_PY_ERROR };

MP_INLINE void *mp_unlock(int64_t *t) {  // PyEval_SaveThread: the GIL released
	return ((void *(*)(void))t[MP_FT_W_SAVE])();
}

MP_INLINE void mp_relock(int64_t *t, void *ts) {
	((void (*)(void *))t[MP_FT_W_RESTORE])(ts);
}

MP_INLINE void mp_decref(int64_t *t, PyObject *o) {
	((void (*)(PyObject *))t[MP_FT_W_DECREF])(o);
}

// mp_interrupted: a call the GIL was released for failed with err; MP_W_OK to try it again
// (EINTR, once Python's signal handlers have run), else MP_W_PY_ERROR (a handler raised) or
// -err.
MP_INLINE long mp_interrupted(int64_t *t, int err) {
	if (err != EINTR) {
		return -err;
	}
	return ((int (*)(void))t[MP_FT_W_SIGNALS])() ? MP_W_PY_ERROR : MP_W_OK;
}

// mp_read_some reads at most n bytes from fd into buf, the GIL released: *got bytes (0 at
// the pipe's end), or a step's failure.
MP_INLINE long mp_read_some(int64_t *t, long fd, unsigned char *buf, long n, long *got) {
	for (;;) {
		void *ts = mp_unlock(t);
		*got = MP_SYS(t, SYS_read, fd, (long)buf, n);
		int err = mp_errno(t);
		mp_relock(t, ts);
		if (*got >= 0) {
			return *got ? MP_W_OK : MP_W_END;
		}
		long r = mp_interrupted(t, err);
		if (r != MP_W_OK) {
			return r;
		}
	}
}

MP_INLINE void mp_copy(unsigned char *dst, const unsigned char *src, long n) {
	volatile unsigned char *d = dst;
	for (long i = 0; i < n; i++) {
		d[i] = src[i];
	}
}

// mp_next_request reads the next frame of the request pipe into a new bytes object (*body).
// buf (MP_W_BUF bytes) holds what was read ahead, *have bytes of it; a small frame comes in
// one read. (The host sends a request only once the last one is answered, so that nothing
// is left in buf when the loop returns to Python.)
#define MP_W_BUF 4096
MP_INLINE long mp_next_request(int64_t *t, unsigned char *buf, long *have, PyObject **body) {
	const long fd = t[MP_FT_W_IN];
	long got, r;
	while (*have < 4) {
		if ((r = mp_read_some(t, fd, buf + *have, MP_W_BUF - *have, &got)) != MP_W_OK) {
			return r;
		}
		*have += got;
	}
	const long n = (long)mp_u32(buf);
	while (n + 4 <= MP_W_BUF && *have < n + 4) {
		if ((r = mp_read_some(t, fd, buf + *have, MP_W_BUF - *have, &got)) != MP_W_OK) {
			return r;
		}
		*have += got;
	}
	long in_buf = *have - 4 < n ? *have - 4 : n;
	PyObject *b = ((PyObject * (*)(const char *, Py_ssize_t)) t[MP_FT_W_NEW_BYTES])(0, n);
	if (!b) {
		return MP_W_PY_ERROR;
	}
	unsigned char *data = ((unsigned char *(*)(PyObject *))t[MP_FT_W_BYTES_AT])(b);
	mp_copy(data, buf + 4, in_buf);
	mp_copy(buf, buf + 4 + in_buf, *have - 4 - in_buf);  // (what came after it)
	*have -= 4 + in_buf;
	for (long at = in_buf; at < n; at += got) {  // a large frame: the rest straight into the object
		if ((r = mp_read_some(t, fd, data + at, n - at, &got)) != MP_W_OK) {
			mp_decref(t, b);
			return r;
		}
	}
	*body = b;
	return MP_W_OK;
}

// mp_write_parts writes the n buffers in views to fd in a row with writev, the GIL
// released.
MP_INLINE long mp_write_parts(int64_t *t, long fd, Py_buffer *views, int n) {
	struct iovec iov[16];
	for (int i = 0; i < n; i++) {
		iov[i].iov_base = views[i].buf;
		iov[i].iov_len = (size_t)views[i].len;
	}
	int k = 0;
	while (k < n) {
		void *ts = mp_unlock(t);
		long w = MP_SYS(t, SYS_writev, fd, (long)(iov + k), (long)(n - k));
		int err = mp_errno(t);
		mp_relock(t, ts);
		if (w < 0) {
			long r = mp_interrupted(t, err);
			if (r != MP_W_OK) {
				return r;
			}
			continue;
		}
		for (; k < n && w >= (long)iov[k].iov_len; k++) {
			w -= (long)iov[k].iov_len;
		}
		if (k < n) {
			iov[k].iov_base = (unsigned char *)iov[k].iov_base + w;
			iov[k].iov_len -= (size_t)w;
		}
	}
	return MP_W_OK;
}

// mp_answer writes the answer's frame (ans: W_HANDLE's tuple of buffers, its header first),
// and notes whether the request may have changed the state (the flag in the header's last
// byte).
MP_INLINE long mp_answer(int64_t *t, PyObject *ans) {
	const long n = ((Py_ssize_t(*)(PyObject *))t[MP_FT_W_TUPLE_LEN])(ans);
	Py_buffer views[16];
	long r = n < 1 ? MP_W_PY_ERROR : MP_W_OK;
	for (long at = 0; at < n && r == MP_W_OK;) {
		int k = 0;
		for (; k < 16 && at + k < n; k++) {
			PyObject *part = ((PyObject * (*)(PyObject *, Py_ssize_t)) t[MP_FT_W_TUPLE_AT])(ans, at + k);
			if (!part || ((int (*)(PyObject *, Py_buffer *, int))t[MP_FT_W_GET_BUF])(part, &views[k], PyBUF_SIMPLE)) {
				r = MP_W_PY_ERROR;
				break;
			}
		}
		if (r == MP_W_OK && at == 0) {
			const unsigned char *head = (const unsigned char *)views[0].buf;
			long changed = views[0].len > 0 && (head[views[0].len - 1] & t[MP_FT_W_CHANGED_BIT]);
			t[MP_FT_W_CHANGED] = changed;
			t[MP_FT_G_GEN] = (t[MP_FT_G_GEN] + changed) & 0xFFFFFFFF;
		}
		if (r == MP_W_OK) {
			r = mp_write_parts(t, t[MP_FT_W_OUT], views, k);
		}
		for (int i = 0; i < k; i++) {
			((void (*)(Py_buffer *))t[MP_FT_W_REL_BUF])(&views[i]);
		}
		at += k;
	}
	return r;
}

// mp_reap reaps the replaced snapshots that have ended (UNREAPED), and adds pid, killed,
// to them (0: none); with all 8 slots taken, it waits for the oldest.
MP_INLINE void mp_reap(int64_t *t, long pid) {
	int64_t *slot = &t[MP_FT_W_UNREAPED];
	if (pid && t[MP_FT_W_NREAPED] == 8) {
		MP_SYS(t, SYS_wait4, slot[0], 0L, 0L, 0L);
		slot[0] = 0;
	}
	long n = 0;
	for (long i = 0; i < t[MP_FT_W_NREAPED] && i < 8; i++) {
		if (slot[i] && MP_SYS(t, SYS_wait4, slot[i], 0L, (long)WNOHANG, 0L) == 0) {
			slot[n++] = slot[i];  // (reaped, or not this process's child: gone)
		}
	}
	if (pid && n < 8) {
		slot[n++] = pid;
	}
	t[MP_FT_W_NREAPED] = n;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // (Linux 5.14; older kernels refuse it: nothing is copied ahead)
#endif

// The most of the address space the notes read each time, and of one mapping, in pages,
// and the most lines of /proc/self/maps: the code can reserve terabytes (MAP_NORESERVE) or
// map thousands of areas, and the notes must stay a few milliseconds.
#define MP_W_SCAN_PAGES (1L << 19)
#define MP_W_SCAN_MAPPING (1L << 18)
#define MP_W_SCAN_LINES 8192

// mp_note_pages adds the pages of [lo, hi) that only this process maps and are present (so
// written since the last snapshot's fork, or new) to W_PAGES, read from pagemap (fd), each
// with its lowest bit set when W_PREV does not have it (*j: where to look in W_PREV next,
// whose pages are in order too); *budget: how many pages may still be read.
MP_INLINE void mp_note_pages(int64_t *t, long pagemap, unsigned long lo, unsigned long hi, long *budget, long *j) {
	int64_t *pages = (int64_t *)t[MP_FT_W_PAGES];
	const int64_t *prev = (const int64_t *)t[MP_FT_W_PREV];
	uint64_t *e = (uint64_t *)t[MP_FT_W_SCRATCH];  // 512 entries
	if (hi <= lo || (long)((hi - lo) >> 12) > MP_W_SCAN_MAPPING || (long)((hi - lo) >> 12) > *budget) {
		return;
	}
	*budget -= (long)((hi - lo) >> 12);
	for (unsigned long p = lo; p < hi && t[MP_FT_W_NPAGES] < t[MP_FT_W_PAGES_CAP];) {
		long n = (long)((hi - p) >> 12) < 512 ? (long)((hi - p) >> 12) : 512;
		long got = MP_SYS(t, SYS_pread64, pagemap, (long)e, n * 8, (long)((p >> 12) * 8));
		if (got <= 0) {
			return;
		}
		for (long i = 0; i < got / 8 && t[MP_FT_W_NPAGES] < t[MP_FT_W_PAGES_CAP]; i++) {
			if ((e[i] >> 63) & (e[i] >> 56) & 1) {  // present, exclusively mapped
				int64_t page = (int64_t)(p + ((unsigned long)i << 12));
				while (*j < t[MP_FT_W_NPREV] && (prev[*j] & ~1L) < page) {
					(*j)++;
				}
				pages[t[MP_FT_W_NPAGES]++] = page | (*j < t[MP_FT_W_NPREV] && (prev[*j] & ~1L) == page ? 0 : 1);
			}
		}
		p += (unsigned long)(got / 8) << 12;
	}
}

// mp_hex parses the hexadecimal number at *s, moving past it.
MP_INLINE unsigned long mp_hex(const unsigned char **s) {
	unsigned long v = 0;
	for (;; (*s)++) {
		unsigned c = **s;
		if (c >= '0' && c <= '9') {
			v = v << 4 | (c - '0');
		} else if (c >= 'a' && c <= 'f') {
			v = v << 4 | (c - 'a' + 10);
		} else {
			return v;
		}
	}
}

// mp_note_written fills W_PAGES with the pages of the process's private writable mappings
// written since the last snapshot's fork (/proc/self/maps, pagemap), the GIL released.
MP_INLINE void mp_note_written(int64_t *t) {
	int64_t last = t[MP_FT_W_PAGES];
	t[MP_FT_W_PAGES] = t[MP_FT_W_PREV];
	t[MP_FT_W_PREV] = last;
	t[MP_FT_W_NPREV] = t[MP_FT_W_NPAGES];
	t[MP_FT_W_NPAGES] = 0;
	long maps = mp_open(t, AT_FDCWD, (const char *)t[MP_FT_W_MAPS], O_RDONLY);
	long pagemap = maps < 0 ? -1 : mp_open(t, AT_FDCWD, (const char *)t[MP_FT_W_PAGEMAP], O_RDONLY);
	unsigned char *chunk = (unsigned char *)t[MP_FT_W_SCRATCH] + 4096, line[64];  // (2 KiB)
	int len = 0, skip = 0;
	long budget = MP_W_SCAN_PAGES, lines = 0, j = 0;
	for (long got; pagemap >= 0 && lines < MP_W_SCAN_LINES && t[MP_FT_W_NPAGES] < t[MP_FT_W_PAGES_CAP] &&
	               (got = MP_SYS(t, SYS_read, maps, (long)chunk, 2048L)) > 0;) {
		for (long i = 0; i < got; i++) {  // each line's first 63 bytes: "lo-hi perms ..."
			unsigned char c = chunk[i];
			if (!skip && c != '\n' && len < 63) {
				line[len++] = c;
				continue;
			}
			if (!skip) {
				line[len] = 0;
				const unsigned char *s = line;
				unsigned long lo = mp_hex(&s);
				unsigned long hi = *s == '-' ? (s++, mp_hex(&s)) : 0;
				if (*s == ' ' && s[1] && s[2] == 'w' && s[3] && s[4] == 'p') {
					mp_note_pages(t, pagemap, lo, hi, &budget, &j);
				}
				lines++;
			}
			skip = c != '\n';
			len = 0;
		}
	}
	if (pagemap >= 0) {
		mp_close(t, pagemap);
	}
	if (maps >= 0) {
		mp_close(t, maps);
	}
}

// mp_request_waits says whether the request pipe has something to read (or an error, which
// the read says).
MP_INLINE int mp_request_waits(int64_t *t) {
	struct pollfd p;
	volatile struct pollfd *vp = &p;
	vp->fd = (int)t[MP_FT_W_IN];
	vp->events = POLLIN;
	vp->revents = 0;
	struct timespec now;  // (no wait)
	volatile struct timespec *vn = &now;
	vn->tv_sec = vn->tv_nsec = 0;
	return MP_SYS(t, SYS_ppoll, (long)&p, 1L, (long)&now, 0L, 0L) != 0;
}

// mp_copy_ahead copies W_PAGES (their pages, shared with the new snapshot) until a request
// comes, the GIL released, a run of adjacent pages at a time.
MP_INLINE void mp_copy_ahead(int64_t *t) {
	const int64_t *pages = (const int64_t *)t[MP_FT_W_PAGES];
	const long n = t[MP_FT_W_NPAGES];
	const long left = t[MP_FT_W_CYCLE] & 7;  // the eighth left to the run (by 32 KiB)
	for (long i = 0, batch = 0; i < n;) {
		if ((pages[i] & 1) || ((pages[i] >> 15) & 7) == left) {  // (noted once; the eighth left)
			i++;
			continue;
		}
		long k = 1;
		while (i + k < n && pages[i + k] == pages[i] + (k << 12) && ((pages[i + k] >> 15) & 7) != left) {
			k++;
		}
		if (MP_SYS(t, SYS_madvise, pages[i], k << 12, (long)MADV_POPULATE_WRITE) == 0) {
			t[MP_FT_W_AHEAD] += k;
		} else if (mp_errno(t) == EINVAL) {
			return;  // (a kernel before 5.14)
		}  // (else a page gone since, or no memory for its copy: the run's write finds out)
		i += k;
		if ((batch += k) >= 16) {
			batch = 0;
			if (mp_request_waits(t)) {
				return;
			}
		}
	}
}

// mp_serve_snapshot forks a rollback snapshot (MP_OP_SNAPSHOT's), tells the guardian it
// replaces the last one (the report worker.py's snapshot_made sends), kills that one and
// reaps what it can; 0 in the snapshot, once it takes over. A fork the kernel refused
// (EAGAIN under the Processes limit) leaves no snapshot, and says so on the host's stderr
// pipe: the older one is not "before this run".
MP_INLINE long mp_serve_snapshot(int64_t *t) {
	// What the worker wrote since the last snapshot's fork (none: all it ever wrote, which
	// says nothing of the next run), unless the next request is there already (no time to
	// copy ahead).
	if (t[MP_FT_G_SNAP] && t[MP_FT_W_PAGES_CAP] && !mp_request_waits(t)) {
		void *ts = mp_unlock(t);
		mp_note_written(t);
		mp_relock(t, ts);
	} else {
		t[MP_FT_W_NPAGES] = 0;
	}
	long pid = mp_snapshot(t);
	if (pid == 0) {
		return 0;
	}
	if (pid > 0 && t[MP_FT_W_NPAGES]) {
		void *ts = mp_unlock(t);
		mp_copy_ahead(t);
		mp_relock(t, ts);
	}
	t[MP_FT_W_CYCLE]++;
	if (pid < 0) {
		char msg[256];
		int n = mp_cat(msg, 0, 120, (const char *)t[MP_FT_W_NO_SNAP]);  // "... answer: [Errno "
		n = mp_num(msg, n, 140, -pid);
		n = mp_cat(msg, n, 142, (const char *)t[MP_FT_W_NO_SNAP] + mp_len((const char *)t[MP_FT_W_NO_SNAP]) + 1);
		n = mp_cat(msg, n, 250, ((const char *(*)(int))t[MP_FT_W_STRERROR])((int)-pid));
		msg[n++] = '\n';
		MP_SYS(t, SYS_write, t[MP_FT_W_ERR], (long)msg, (long)n);
		pid = 0;
	}
	long old = t[MP_FT_G_SNAP], died = 0;
	t[MP_FT_G_SNAP] = pid;
	if (old) {  // (ended before this one replaced it: killed from outside; the host counts it)
		long r = MP_SYS(t, SYS_wait4, old, 0L, (long)WNOHANG, 0L);
		died = r == old || (r < 0 && mp_errno(t) == ECHILD);
	}
	// The guardian learns of the new one before the old one goes, so that a crash in
	// between still finds a snapshot.
	unsigned char m[10];
	volatile unsigned char *vm = m;
	vm[0] = (unsigned char)t[MP_FT_G_REPORT];
	for (int i = 0; i < 4; i++) {
		vm[1 + i] = (unsigned char)(pid >> (8 * i));
		vm[5 + i] = (unsigned char)(t[MP_FT_G_GEN] >> (8 * i));
	}
	vm[9] = (unsigned char)died;
	MP_SYS(t, SYS_write, t[MP_FT_SOCK], (long)m, 10L);
	if (old && !died) {
		MP_SYS(t, SYS_kill, old, (long)SIGKILL);
	}
	mp_reap(t, old && !died ? old : 0);
	return 1;
}

// mp_worker_loop is MP_OP_SERVE (see cpython.h).
MP_INLINE long mp_worker_loop(int64_t *t) {
	unsigned char *buf = (unsigned char *)t[MP_FT_W_SCRATCH] + 8192;  // (MP_W_BUF: not the stack's, which snapshots share)
	long have = 0;
	for (;;) {
		if (t[MP_FT_W_SNAPSHOTS] && t[MP_FT_W_CHANGED]) {
			t[MP_FT_W_CHANGED] = 0;
			if (mp_serve_snapshot(t) == 0) {
				return 1;
			}
		}
		PyObject *body = 0;
		long r = mp_next_request(t, buf, &have, &body);
		if (r == MP_W_END) {
			((void (*)(int))t[MP_FT_EXIT])(0);  // the host is gone: nothing may outlive it
		}
		if (r != MP_W_OK) {
			return r == MP_W_PY_ERROR ? -1 : r;
		}
		PyObject *ans = ((PyObject * (*)(PyObject *, ...)) t[MP_FT_W_CALL])((PyObject *)t[MP_FT_W_HANDLE], body, (PyObject *)0);
		mp_decref(t, body);
		if (!ans) {
			return -1;
		}
		if (ans == (PyObject *)t[MP_FT_W_NONE]) {
			mp_decref(t, ans);
			return 0;
		}
		r = mp_answer(t, ans);
		mp_decref(t, ans);
		if (r != MP_W_OK) {
			return r == MP_W_PY_ERROR ? -1 : r;
		}
	}
}

MP_CODE_ATTRS long mp_fork_code(int64_t *t) {
	if (t[MP_FT_OP] == MP_OP_SNAPSHOT) {
		return mp_snapshot(t);
	}
	if (t[MP_FT_OP] == MP_OP_SERVE) {
		return mp_worker_loop(t);
	}
	const int loop = t[MP_FT_OP] == MP_OP_TEMPLATE;
	unsigned long chld = 1UL << (SIGCHLD - 1);
	unsigned char names[512];
	if (loop) {  // SIGCHLD through the signalfd while in here; the forks get the mask back
		MP_SYS(t, SYS_rt_sigprocmask, (long)SIG_BLOCK, (long)&chld, (long)&t[MP_FT_T_MASK], 8L);
		if (t[MP_FT_T_SFD] < 0) {
			t[MP_FT_T_SFD] = MP_SYS(t, SYS_signalfd4, -1L, (long)&chld, 8L, (long)(O_CLOEXEC | O_NONBLOCK));
		}
	}
	for (;;) {
		if (loop && (t[MP_FT_T_SFD] < 0 || !mp_template_next(t, names))) {
			MP_SYS(t, SYS_rt_sigprocmask, (long)SIG_SETMASK, (long)&t[MP_FT_T_MASK], 0L, 8L);
			return 1;
		}
		long pid = mp_sandbox(t, loop);
		if (!loop || pid == 0) {
			return pid;
		}
		if (pid < 0) {  // (T's own failures it says itself, on the same fd)
			mp_say(t, t[MP_FT_S_FDS + 2], MP_SS_TEMPLATE_FORK, (int)-pid);
		}
		for (int i = 0; i < 6 + t[MP_FT_S_NCG] && i < 8; i++) {  // the fork's now: the host's reads end with it
			mp_close(t, t[i < 6 ? MP_FT_S_FDS + i : MP_FT_S_CG + i - 6]);
		}
	}
}
