/* Shared by the benchmarks that run nginx with the module (gateway_bench,
 * bigprompt_bench): a free loopback port, nginx started on a generated config, and a
 * minimal HTTP/1.1 keep-alive client. Header-only; the including file holds one nginx. */
#ifndef KVG_BENCH_HTTP_H
#define KVG_BENCH_HTTP_H

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static int http_port;            /* the port bench_start_nginx listens on */

/* A port that was free a moment ago (bind to 0, close). */
static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    socklen_t l = sizeof a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(s, (struct sockaddr *)&a, sizeof a);
    getsockname(s, (struct sockaddr *)&a, &l);
    close(s);
    return ntohs(a.sin_port);
}

/* Starts Debian's nginx in the foreground with the module of build/ and one worker,
 * everything under dir, talking to the engine at sock; http_conf goes into the http
 * block, server_conf into the server listening on http_port. The pid, or -1. */
__attribute__((unused)) static pid_t bench_start_nginx(const char *dir, const char *build,
                                                       const char *sock, const char *http_conf,
                                                       const char *server_conf)
{
    char conf[4096], path[1024], module[1200], cwd[512];
    if (build[0] == '/')
        snprintf(module, sizeof module, "%s/ngx_http_kvgate_module.so", build);
    else if (getcwd(cwd, sizeof cwd))
        snprintf(module, sizeof module, "%s/%s/ngx_http_kvgate_module.so", cwd, build);
    else
        return -1;
    http_port = free_port();
    snprintf(path, sizeof path, "%s/logs", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/nginx.conf", dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    snprintf(conf, sizeof conf,
             "load_module %s;\ndaemon off;\nworker_processes 1;\npid %s/nginx.pid;\n"
             "error_log %s/logs/error.log warn;\nevents { worker_connections 1024; }\n"
             "http {\n access_log off;\n client_body_temp_path %s/cbt;\n proxy_temp_path %s/pt;\n"
             " fastcgi_temp_path %s/ft;\n uwsgi_temp_path %s/ut;\n scgi_temp_path %s/st;\n"
             " kvgate_engine unix:%s;\n kvgate_tenant $http_x_tenant_id;\n %s\n"
             " server { listen 127.0.0.1:%d; keepalive_requests 1000000;\n  %s }\n}\n",
             module, dir, dir, dir, dir, dir, dir, dir, sock, http_conf, http_port, server_conf);
    fputs(conf, f);
    fclose(f);
    pid_t pid = fork();
    if (pid == 0) {
        int dn = open("/dev/null", O_WRONLY);
        dup2(dn, 1);
        dup2(dn, 2);
        char pre[128];
        snprintf(pre, sizeof pre, "%s/", dir);
        execl("/usr/sbin/nginx", "nginx", "-p", pre, "-c", path, (char *)NULL);
        _exit(127);
    }
    return pid;
}

typedef struct http {
    int fd;
    char buf[1 << 16];
    size_t have;
} http;

/* Connects to http_port (retrying while nginx starts). */
__attribute__((unused)) static int http_open(http *h)
{
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)http_port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int tries = 0; tries < 200; tries++) {
        h->fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(h->fd, (struct sockaddr *)&a, sizeof a) == 0) {
            int one = 1;
            setsockopt(h->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            h->have = 0;
            return 0;
        }
        close(h->fd);
        usleep(20000);
    }
    return -1;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* One POST on a keep-alive connection (tenant "bench"); returns the status, 0 on a
 * transport error. The answer's body is skipped. */
__attribute__((unused)) static int http_post(http *h, const char *path, const char *body, size_t len)
{
    char head[512];
    int n = snprintf(head, sizeof head,
                     "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Tenant-Id: bench\r\n"
                     "Content-Length: %zu\r\n\r\n", path, len);
    if (write_all(h->fd, head, (size_t)n) != 0 || write_all(h->fd, body, len) != 0)
        return 0;
    for (;;) {
        char *end = memmem(h->buf, h->have, "\r\n\r\n", 4);
        if (end) {
            size_t hl = (size_t)(end - h->buf) + 4, cl = 0;
            char *c = memmem(h->buf, hl, "Content-Length: ", 16);
            if (c)
                cl = (size_t)strtoul(c + 16, NULL, 10);
            if (h->have >= hl + cl) {
                int status = atoi(h->buf + 9);
                memmove(h->buf, h->buf + hl + cl, h->have - hl - cl);
                h->have -= hl + cl;
                return status;
            }
        }
        ssize_t r = read(h->fd, h->buf + h->have, sizeof h->buf - h->have);
        if (r <= 0)
            return 0;
        h->have += (size_t)r;
    }
}

#endif
