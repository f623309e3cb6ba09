// Issue 12, session 21: writev against vmsplice + splice for [40-byte header + payload]
// messages over one loopback TCP connection (sender and receiver threads, 64 MiB regions).
// gcc -O2 -pthread -o spl issue12-s21-vmsplice.c; ./spl MODE THREADS [MSG]; MODE 0 writev,
// 1 vmsplice (pipe of 256 KiB: MSG must fit in it, or the sender blocks for good).
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <errno.h>

static size_t MSG = 32768, REGION = 64<<20; static long N = 200000; static int mode = 0;
struct pair { int s, r; char *src, *dst; };
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void *sender(void *a){ struct pair *p=a; char hdr[40]; memset(hdr,1,40);
  int pp[2]; if(mode){ if(pipe(pp)) abort(); fcntl(pp[1],F_SETPIPE_SZ,256*1024);} 
  size_t off=0;
  for(long i=0;i<N;i++){ char *pl=p->src+off; off=(off+MSG)%REGION;
    if(!mode){ struct iovec iv[2]={{hdr,40},{pl,MSG}}; size_t left=40+MSG; 
      while(left){ ssize_t n=writev(p->s,iv,2); if(n<0){perror("writev");abort();} left-=n; if(left){ /*simple*/ size_t d=n; for(int k=0;k<2;k++){ if(d>=iv[k].iov_len){d-=iv[k].iov_len;iv[k].iov_len=0;} else {iv[k].iov_base=(char*)iv[k].iov_base+d; iv[k].iov_len-=d; d=0;} } } }
    } else {
      if(write(pp[1],hdr,40)!=40) abort();
      struct iovec iv={pl,MSG}; size_t left=MSG; while(left){ ssize_t n=vmsplice(pp[1],&iv,1,0); if(n<0){perror("vmsplice");abort();} left-=n; iv.iov_base=(char*)iv.iov_base+n; iv.iov_len-=n; }
      size_t tot=40+MSG; while(tot){ ssize_t n=splice(pp[0],NULL,p->s,NULL,tot,SPLICE_F_MOVE|SPLICE_F_MORE); if(n<0){perror("splice");abort();} tot-=n; }
    }
  } return 0; }
static void *receiver(void *a){ struct pair *p=a; char hdr[40]; size_t off=0;
  for(long i=0;i<N;i++){ size_t got=0; while(got<40){ssize_t n=recv(p->r,hdr+got,40-got,0); if(n<=0)abort(); got+=n;}
    char *d=p->dst+off; off=(off+MSG)%REGION; got=0; while(got<MSG){ssize_t n=recv(p->r,d+got,MSG-got,0); if(n<=0)abort(); got+=n;} }
  return 0; }
int main(int c,char**v){ mode=atoi(v[1]); int T=c>2?atoi(v[2]):1; if(c>3) MSG=atol(v[3]); N = (long)(6.4e9/MSG/T);
  int ls=socket(AF_INET,SOCK_STREAM,0); struct sockaddr_in a={.sin_family=AF_INET,.sin_addr.s_addr=htonl(0x7f000001)}; int one=1; setsockopt(ls,SOL_SOCKET,SO_REUSEADDR,&one,4);
  bind(ls,(void*)&a,sizeof a); socklen_t l=sizeof a; getsockname(ls,(void*)&a,&l); listen(ls,64);
  struct pair P[64]; pthread_t ts[128];
  for(int t=0;t<T;t++){ P[t].s=socket(AF_INET,SOCK_STREAM,0); connect(P[t].s,(void*)&a,sizeof a); P[t].r=accept(ls,0,0);
    setsockopt(P[t].s,IPPROTO_TCP,TCP_NODELAY,&one,4);
    P[t].src=mmap(0,REGION,3,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); P[t].dst=mmap(0,REGION,3,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); memset(P[t].src,7,REGION); memset(P[t].dst,0,REGION);}
  struct rusage r0,r1; getrusage(RUSAGE_SELF,&r0); double t0=now();
  for(int t=0;t<T;t++){pthread_create(&ts[2*t],0,sender,&P[t]);pthread_create(&ts[2*t+1],0,receiver,&P[t]);}
  for(int t=0;t<2*T;t++) pthread_join(ts[t],0);
  double dt=now()-t0; getrusage(RUSAGE_SELF,&r1);
  double cpu=(r1.ru_utime.tv_sec-r0.ru_utime.tv_sec+r1.ru_stime.tv_sec-r0.ru_stime.tv_sec)+(r1.ru_utime.tv_usec-r0.ru_utime.tv_usec+r1.ru_stime.tv_usec-r0.ru_stime.tv_usec)*1e-6;
  double bytes=(double)N*MSG*T; printf("mode=%s T=%d msg=%zu GB/s=%.2f cpu_s=%.2f GB_per_cpu_s=%.2f\n", mode?"splice":"copy",T,MSG,bytes/dt/1e9,cpu,bytes/cpu/1e9); return 0; }
