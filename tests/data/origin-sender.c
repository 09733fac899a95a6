/* A static statsd sender for the origin detection tests: sends `line` to the Unix
 * datagram socket `path` `count` times, `interval_ms` apart, then exits. Built with
 * `cc -static` and imported as a Docker image of one file (there is no image registry
 * here), so that each container is a real process in a real container cgroup. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s <socket> <count> <interval_ms> <line>\n", argv[0]);
        return 64;
    }
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (strlen(argv[1]) >= sizeof address.sun_path) {
        fprintf(stderr, "socket path too long\n");
        return 64;
    }
    strcpy(address.sun_path, argv[1]);
    long count = atol(argv[2]);
    long interval_ms = atol(argv[3]);
    const char *line = argv[4];
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    if (fd < 0) {
        perror("socket");
        return 1;
    }
    struct timespec pause = {.tv_sec = interval_ms / 1000, .tv_nsec = (interval_ms % 1000) * 1000000L};
    long sent = 0;
    for (long i = 0; i < count; i++) {
        /* The collector may not be bound yet, or its buffer full for a moment: retry. */
        int tries = 0;
        while (sendto(fd, line, strlen(line), 0, (struct sockaddr *)&address, sizeof address) < 0) {
            if (++tries > 200) {
                perror("sendto");
                return 1;
            }
            usleep(10000);
        }
        sent++;
        if (interval_ms > 0) nanosleep(&pause, NULL);
    }
    printf("sent %ld\n", sent);
    return 0;
}
