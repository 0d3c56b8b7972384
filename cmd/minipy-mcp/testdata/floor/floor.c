// floor: the least a sandbox forked from a template costs the kernel, for BenchmarkE2BScale
// to set minipy's creation rate beside (issue 70). A process as big as the template (MB of
// anonymous memory, touched) makes SANDBOXES sandboxes, PAR at a time: each one process,
// cloned straight into new user, mount, pid, network, IPC and UTS namespaces (minipy's
// sandbox has those, and three processes), that maps its ids, writes COW of the pages it
// shares with the template (a worker's start and first run write ~600 on CPython 3.11)
// and exits. No cgroup, no Python, no server, no client: what is left when all of those
// cost nothing. Prints one JSON object: {"perSecond": N, "cpuMsEach": N}, the creations a
// second and the machine's CPU each one took (/proc/stat's busy time: the kernel's workers
// too, which tear a network namespace down).
//
//   floor MB SANDBOXES PAR COW
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char *mem;
static size_t size;
static int cow;

static double now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

// busy is the machine's CPU time so far, every CPU's, in seconds: /proc/stat's first line
// but its idle and iowait.
static double busy(void) {
	unsigned long long v[10] = {0};
	FILE *f = fopen("/proc/stat", "r");
	if (!f || fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
	                 &v[7]) != 8) {
		perror("floor: /proc/stat");
		exit(1);
	}
	fclose(f);
	return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / sysconf(_SC_CLK_TCK);
}

static int put(const char *path, const char *text) {
	int f = open(path, O_WRONLY);
	if (f < 0) {
		return -1;
	}
	int ok = write(f, text, strlen(text)) == (ssize_t)strlen(text);
	close(f);
	return ok ? 0 : -1;
}

// sandbox is the new process: pid 1 of its namespaces.
static int sandbox(uid_t uid, gid_t gid) {
	char map[64];
	snprintf(map, sizeof map, "%d %d 1", uid, uid);
	if (put("/proc/self/setgroups", "deny") || put("/proc/self/uid_map", map)) {
		return 2;
	}
	snprintf(map, sizeof map, "%d %d 1", gid, gid);
	if (put("/proc/self/gid_map", map)) {
		return 3;
	}
	for (int k = 0; k < cow; k++) {  // pages spread over the template's memory, as a worker's are
		mem[(size_t)k * 4096 * 7 % size]++;
	}
	return 0;
}

int main(int argc, char **argv) {
	if (argc != 5) {
		fprintf(stderr, "usage: floor MB SANDBOXES PAR COW\n");
		return 2;
	}
	int n = atoi(argv[2]), par = atoi(argv[3]);
	size = (size_t)atol(argv[1]) << 20;
	cow = atoi(argv[4]);
	if (size == 0 || n < 1 || par < 1) {
		fprintf(stderr, "floor: bad arguments\n");
		return 2;
	}
	mem = malloc(size);
	for (size_t i = 0; i < size; i += 4096) {
		mem[i] = 1;
	}
	uid_t uid = getuid();
	gid_t gid = getgid();
	long flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD;
	double start = now(), cpu0 = busy();
	for (int p = 0; p < par; p++) {
		if (fork() == 0) {
			for (int i = p; i < n; i += par) {
				long pid = syscall(SYS_clone, flags, 0L, 0L, 0L, 0L);
				if (pid == 0) {
					_exit(sandbox(uid, gid));
				}
				int st;
				if (pid < 0 || waitpid((pid_t)pid, &st, 0) < 0 || st != 0) {
					perror("floor: a sandbox failed");
					_exit(1);
				}
			}
			_exit(0);
		}
	}
	int failed = 0, st;
	while (wait(&st) > 0) {
		failed |= st != 0;
	}
	double took = now() - start, cpu = busy() - cpu0;
	if (failed) {
		return 1;
	}
	printf("{\"perSecond\": %.1f, \"cpuMsEach\": %.3f}\n", n / took, cpu * 1e3 / n);
	return 0;
}
