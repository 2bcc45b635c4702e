/* nvidia-smi and the benchmark of a simulated host: clients of the host's GPU service.
 *
 * Sends the program's name and arguments to the service (a unix socket; a 4-byte big-endian
 * length, then NUL-terminated strings) and prints its reply (exit code, stdout, stderr, each
 * behind a 4-byte length). The same protocol as client.py, which runs where no C compiler is.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef SERVICE
#define SERVICE "/run/nvidia-gpu/service.sock"
#endif

static int readn(int fd, char *b, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

static void writeall(int fd, const char *b, size_t n) {
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w <= 0) return;
        b += w;
        n -= (size_t)w;
    }
}

static unsigned be32(const unsigned char *p) {
    return ((unsigned)p[0] << 24) | ((unsigned)p[1] << 16) | ((unsigned)p[2] << 8) | p[3];
}

int main(int argc, char **argv) {
    const char *prog = strrchr(argv[0], '/');
    prog = prog ? prog + 1 : argv[0];
    size_t len = strlen(prog) + 1;
    for (int i = 1; i < argc; i++) len += strlen(argv[i]) + 1;
    char *buf = malloc(len + 4);
    if (!buf) return 9;
    buf[0] = (char)(len >> 24); buf[1] = (char)(len >> 16); buf[2] = (char)(len >> 8); buf[3] = (char)len;
    char *p = buf + 4;
    strcpy(p, prog);
    p += strlen(prog) + 1;
    for (int i = 1; i < argc; i++) {
        strcpy(p, argv[i]);
        p += strlen(argv[i]) + 1;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    strncpy(a.sun_path, SERVICE, sizeof a.sun_path - 1);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        fprintf(stderr, "%s: cannot reach the GPU service at %s\n", prog, SERVICE);
        return 9;
    }
    writeall(fd, buf, len + 4);
    unsigned char h[4];
    if (readn(fd, (char *)h, 4)) {
        fprintf(stderr, "%s: the GPU service closed the connection\n", prog);
        return 9;
    }
    int rc = (int)be32(h);
    for (int stream = 1; stream <= 2; stream++) {
        if (readn(fd, (char *)h, 4)) return 9;
        unsigned n = be32(h);
        char *o = malloc(n + 1);
        if (!o || (n && readn(fd, o, n))) return 9;
        writeall(stream, o, n);
        free(o);
    }
    return rc;
}
