# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""cmq's compiled core: the per-message and per-datagram hot path in C.

What is here, each a drop-in for a pure-Python twin that stays the
reference (``CMQ_PURE_PYTHON=1`` selects the twins; the test suite runs
the sans-IO tests against both and checks byte-for-byte equal output):

- :class:`Stream`, the batcher's per-destination state (as
  :class:`cmq.wire.batcher.Stream`, with C fields for what every push reads);
- :func:`make_append`, :func:`make_sender` and :func:`make_push`: the fast
  half of a push (as ``Batcher._make_append`` and the closures of
  ``cmq.net._base.Endpoint``);
- :class:`TakeIdle` (:func:`make_take_idle`): the idle rule's short path,
  one message to an idle destination leaving at once (as
  ``Batcher.take_idle``);
- :class:`EndpointState`, :class:`ReceiverState`, :class:`BatcherState`
  and :class:`SenderState`: the fields of an endpoint, a receiver, a
  batcher and a reliable sender that every datagram or blocking read
  touches, as C members (the objects of those classes on
  the compiled core are twins on them: :func:`cmq._impl.new_object`);
- :func:`frame` and :func:`split_frames`: framing and parsing of a
  datagram (as :mod:`cmq.wire.frames`);
- :class:`RecvState`, the fields of a receiver's reliable stream (as
  :class:`cmq.wire.reliable.RecvStream`, whose methods it gets from
  :func:`cmq.wire.reliable.recv_stream_type`), as C members that the
  receive paths below reach without attribute lookups;
- :class:`ReceiveOne` (:func:`make_receive_one`): the latency path of a
  blocking read, one datagram of a best-effort or a reliable stream
  straight to the reader (as ``Receiver.receive_one``);
- :func:`make_receive_v2`: the receiver's fast path of reliable streams,
  the next datagram of a stream split into its mailbox with the
  acknowledgement bookkeeping (as the one in
  ``cmq.wire.receiver.Receiver.datagram_received``);
- :class:`SendState`, the fields of a reliable sending stream (as
  :class:`cmq.wire.reliable.SendStream`, whose methods it gets from
  :func:`cmq.wire.reliable.send_stream_type`), as C members;
- :func:`reliable_clear`, :class:`ReliableSent` (:func:`make_reliable_sent`)
  and :func:`release_acked`: the reliable sender's per-datagram
  bookkeeping (as ``ReliableSender.clear``, ``ReliableSender.sent`` and
  :func:`cmq.wire.reliable.release_acked`);
- :class:`IdleAfter` (:func:`make_idle_after`): the slow half of a push in
  its commonest case, one message to an idle destination from ``push`` to
  the kernel (as ``Endpoint._after_append`` and the methods it calls, which
  take every other case);
- :class:`OnStatus`: the reliable sender's handling of a plain STATUS (as
  ``ReliableSender.on_status``, which takes every other report);
- :func:`decode_control`, :func:`encode_control` and :func:`status_of`:
  the control records (STATUS and PROBE) read and written, and a
  receiving stream's STATUS made (as :func:`cmq.wire.frames.decode_control`,
  :func:`cmq.wire.frames.encode_control` and ``RecvStream.status``);
- :class:`Lock`: ``threading.Lock``'s interface over the interpreter's own
  lock, the compiled-core queue's locks, which the compiled paths take
  with a C call;
- :class:`DatagramIO`: many datagrams per system call, ``recvmmsg`` and
  ``sendmmsg``, and one at a time, ``recvfrom`` and ``sendto`` (as the
  socket module's, without its argument parsing and address formatting),
  with the GIL released around every call that may block (calls that
  cannot block keep it).

The compiled parts of one path call each other in C: a round trip's push
(:func:`make_push`, :class:`IdleAfter`, :class:`TakeIdle`,
:class:`ReliableSent`, ``DatagramIO.send1``) and read
(:class:`DirectReader`, ``DatagramIO.recv1``, :class:`ReceiveOne`, the
queue's :class:`Lock` objects) make no Python call between them. Each
keeps the Python-callable interface of its pure twin, and a part that is
not the compiled one (a test's stand-in, a keyed receiver's) is called
through Python as before. Those calls were a fifth of a round trip's
instructions.

Thread safety. The pure path relies on the GIL for two things, and so does
this module, on purpose and no more: a ``list.append`` of a payload to a
stream's batch is atomic (it is under free-threaded CPython too, which
locks the list), and the counters the driver reads (``check_at``) are
written only under the driver's batch lock. Nothing here keeps state
between calls except a :class:`DatagramIO`'s buffers, which one reading
thread owns (the driver's receive lock), and a :class:`ReceiveOne`'s memo
of the last source, which changes only under the driver's state lock (as
the receiver it reads for). :class:`Lock` is a real lock, not one that
relies on the GIL. :func:`make_idle_after` reads a
stream's idle rule before it takes the batch lock, as a hint only: the
rule is applied again under the lock before anything changes.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.tuple cimport PyTuple_GET_SIZE
from cpython.object cimport PyTypeObject
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy, memset, strerror
from libc.math cimport INFINITY, NAN, isnan
from libc.errno cimport errno, EAGAIN, EINTR, EBADF, EINVAL, EIO, ENOPROTOOPT
from posix.unistd cimport close

from cmq._errors import Closed, ProtocolError

cdef extern from "<sys/socket.h>" nogil:
    ctypedef unsigned int socklen_t
    ctypedef unsigned short sa_family_t
    struct sockaddr:
        sa_family_t sa_family
    struct sockaddr_storage:
        sa_family_t ss_family
    struct iovec:
        void *iov_base
        size_t iov_len
    struct msghdr:
        void *msg_name
        socklen_t msg_namelen
        iovec *msg_iov
        size_t msg_iovlen
        void *msg_control
        size_t msg_controllen
        int msg_flags
    struct mmsghdr:
        msghdr msg_hdr
        unsigned int msg_len
    int recvmmsg(int sockfd, mmsghdr *msgvec, unsigned int vlen, int flags, void *timeout)
    ssize_t recv(int sockfd, void *buf, size_t len, int flags)
    ssize_t recvfrom(int sockfd, void *buf, size_t len, int flags, sockaddr *src_addr, socklen_t *addrlen)
    int MSG_PEEK
    ssize_t sendto(int sockfd, const void *buf, size_t len, int flags, const sockaddr *dest_addr, socklen_t addrlen)
    int sendmmsg(int sockfd, mmsghdr *msgvec, unsigned int vlen, int flags)
    int AF_INET
    int AF_INET6
    int MSG_DONTWAIT

cdef extern from "<netinet/in.h>" nogil:
    struct in_addr:
        unsigned int s_addr
    struct sockaddr_in:
        sa_family_t sin_family
        unsigned short sin_port
        in_addr sin_addr
    struct in6_addr:
        unsigned char s6_addr[16]
    struct sockaddr_in6:
        sa_family_t sin6_family
        unsigned short sin6_port
        unsigned int sin6_flowinfo
        in6_addr sin6_addr
        unsigned int sin6_scope_id
    unsigned short ntohs(unsigned short)
    unsigned short htons(unsigned short)
    unsigned int ntohl(unsigned int)
    unsigned int htonl(unsigned int)

cdef extern from "Python.h":
    # The cycle collector's list of containers (see Stream).
    void PyObject_GC_Track(void *op)
    void PyObject_GC_UnTrack(void *op)
    int PyObject_GC_IsTracked(object op)
    # Runs the Python signal handlers (a KeyboardInterrupt raises from here).
    int PyErr_CheckSignals() except -1
    # A new bytes object as an owned pointer (NULL and an exception on failure).
    PyObject *_new_bytes "PyBytes_FromStringAndSize"(const char *v, Py_ssize_t n)

cdef extern from "<malloc.h>" nogil:
    int mallopt(int param, int value)
    int M_TRIM_THRESHOLD
    int M_TOP_PAD

cdef extern from "<arpa/inet.h>" nogil:
    const char *inet_ntop(int af, const void *src, char *dst, socklen_t size)
    int inet_pton(int af, const char *src, void *dst)

cdef extern from "<time.h>" nogil:
    struct timespec:
        long tv_sec
        long tv_nsec
    int clock_gettime(int clk_id, timespec *tp)
    enum: CLOCK_MONOTONIC

cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    int ppoll(pollfd *fds, unsigned long nfds, const timespec *tmo_p, const void *sigmask)
    enum: POLLIN

cdef extern from "<sched.h>" nogil:
    int sched_yield()


cdef inline double _mono() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


# The batcher's answers (cmq.wire.batcher).
cdef object QUEUED = 0
cdef object LARGE = 3
cdef object CHECK = 4

# A frame's long length prefix: 0xFF and 8 bytes (cmq.wire.frames).
cdef enum:
    LONG_PREFIX = 9
    # A v1 datagram's header (frames.HEADER_SIZE).
    V1_HEAD = 16
    # A v2 data datagram's header and extension (frames.HEADER_SIZE + EXT_SIZE).
    V2_HEAD = 24
    # The reliable flags a plain datagram may carry (frames.R_SYN, R_ORDERED).
    R_SYN_ = 0x01
    R_ORDERED_ = 0x02


cdef class Stream:
    """The batch and sequence state of one (address, mailbox) pair.

    The compiled twin of :class:`cmq.wire.batcher.Stream`: the same
    attributes, with the batch list and its counters as C fields (every
    push reads them; :func:`check` and :func:`cut` work on them).

    Cyclic garbage collection. A stream without reliability state (``rel``
    None) holds only objects that cannot lead back to it: its address (a
    tuple of a str and ints), bytes (``head``, ``ext``, the payloads in its
    batch), ints, and lists of those. It cannot be part of a reference
    cycle, so it and its batch list are taken off the cycle collector's
    list when made: a queue with 100,000 destinations then adds nothing
    for the collector to walk on each of its full passes (walking them
    cost more than a push itself). Setting ``rel`` to an object puts the
    stream back on that list (a reliable stream's state refers back to
    its stream). Code that stores anything else in a stream breaks this
    rule; nothing in cmq does.
    """

    # In this order: what every push reads first, next to the object's
    # reference count (one cache line for a push that joins a batch, which
    # counts with many destinations), then what check reads.
    cdef public list frames
    cdef public Py_ssize_t check_at
    cdef public Py_ssize_t counted
    cdef public Py_ssize_t size
    cdef public Py_ssize_t limit
    cdef public long long gen
    cdef public long long armed
    cdef public double last_send
    cdef public object addr
    cdef public object mailbox
    cdef public object head
    cdef public object ext
    cdef object _rel
    cdef public object sizes
    cdef public object seq

    def __init__(self, addr, mailbox, qthresh, head=b""):
        self._init(addr, mailbox, qthresh, head)

    cdef void _init(self, object addr, object mailbox, Py_ssize_t qthresh, object head) noexcept:
        self.addr = addr
        self.mailbox = mailbox
        self.head = head
        self.ext = b""
        self._rel = None
        self.frames = []
        self.limit = qthresh
        self.check_at = 1
        self.counted = 0
        self.size = 0
        # The compiled check keeps no sizes (cut measures the batch): an
        # empty tuple, shared, rather than a list per stream.
        self.sizes = ()
        self.seq = 0
        self.gen = 0
        self.armed = -1
        self.last_send = -INFINITY
        # See the class's docstring: no cycle can pass through this.
        PyObject_GC_UnTrack(<void *>self.frames)
        if PyObject_GC_IsTracked(self):
            PyObject_GC_UnTrack(<void *>self)

    @property
    def rel(self):
        """The reliable stream's state (:class:`cmq.wire.reliable.SendStream`), or None."""
        return self._rel

    @rel.setter
    def rel(self, value):
        self._rel = value
        if value is not None and not PyObject_GC_IsTracked(self):
            # It refers back to this stream: the collector must see the pair.
            PyObject_GC_Track(<void *>self)

    @property
    def pending(self):
        """Messages waiting in the batch."""
        return len(self.frames)


def make_stream(dict streams, dict plain_heads, dict reliable_heads, head_for, Py_ssize_t qthresh):
    """``Batcher.stream(addr, mailbox, *, reliable=False)``: the stream in
    ``streams[mailbox][addr]``, made on first use with the header
    ``reliable_heads[mailbox]`` or ``plain_heads[mailbox]``, or
    ``head_for(mailbox, reliable)`` when that has none yet."""

    def stream(addr, mailbox, *, reliable=False):
        by_addr = streams.get(mailbox)
        if by_addr is not None:
            found = (<dict?>by_addr).get(addr)
            if found is not None:
                return found
        else:
            by_addr = streams.setdefault(mailbox, {})
        head = (reliable_heads if reliable else plain_heads).get(mailbox)
        if head is None:
            head = head_for(mailbox, reliable)
        cdef Stream s = Stream.__new__(Stream)
        s._init(addr, mailbox, qthresh, head)
        return (<dict?>by_addr).setdefault(addr, s)

    return stream


cdef inline object _append(Stream s, object payload, Py_ssize_t large):
    # The fast half of a push (cmq.wire.batcher): LARGE, QUEUED or CHECK.
    if len(payload) >= large:
        return LARGE
    cdef list frames = s.frames
    frames.append(payload)
    if PyList_GET_SIZE(frames) < s.check_at:
        return QUEUED
    return CHECK


def make_append(Py_ssize_t large):
    """The batcher's fast half (``Batcher.append``) for payloads under ``large`` bytes."""

    def append(Stream s, payload):
        return _append(s, payload, large)

    return append


def make_sender(Stream s, after, encode, bint raw, Py_ssize_t large):
    """A push bound to stream ``s`` (``Endpoint.sender``): encode, append, and
    call ``after(s, payload, answer)`` when the batcher's answer is not QUEUED."""

    def send(msg):
        if raw and type(msg) is bytes:
            payload = msg
        else:
            payload = encode(msg)
        r = _append(s, payload, large)
        if r is not QUEUED:
            after(s, payload, r)

    return send


def make_push(dict cache, stream_for, after, encode, bint raw, packb, Py_ssize_t large):
    """``Endpoint.push`` (``push(dest, msg, mailbox=0)``) and its ``forget``;
    ``cache[mailbox][dest]`` is the stream of a destination seen before.

    The last (destination, mailbox) is remembered by identity, as the pure
    closure does; ``forget()`` drops that memo.
    """
    cdef Stream s = Stream(("0.0.0.0", 0), 0, 1)  # a placeholder: last_dest matches no destination
    # The compiled slow half is called in C (an IdleAfter), any other through Python.
    cdef IdleAfter idle_after = after if type(after) is IdleAfter else None
    last_dest = object()
    last_mailbox = -1

    def push(dest, msg, mailbox=0):
        nonlocal s, last_dest, last_mailbox
        if dest is not last_dest or mailbox != last_mailbox:
            try:
                s = cache[mailbox][dest]
            except (KeyError, TypeError):
                s = stream_for(dest, mailbox)
            if type(dest) is tuple or type(dest) is str:
                last_dest = dest
                last_mailbox = mailbox
            else:
                last_dest = object()
        if raw:
            payload = msg if type(msg) is bytes else encode(msg)
        else:
            try:
                payload = packb(msg)
            except (TypeError, ValueError, OverflowError):
                payload = encode(msg)  # raises the documented TypeError
        r = _append(s, payload, large)
        if r is not QUEUED:
            if idle_after is not None:
                idle_after.run(s, payload, r)
            else:
                after(s, payload, r)

    def forget():
        nonlocal last_dest, last_mailbox
        last_dest = object()
        last_mailbox = -1

    return push, forget


cdef object OPENED = 1
cdef object FULL = 2


def check(Stream s, Py_ssize_t max_body):
    """The batcher's slow half of a push (``Batcher.check``): QUEUED, OPENED or FULL.

    Counts the bytes of the messages appended since the last call in one C
    loop. It does not keep their sizes for ``take`` (:func:`cut` measures
    the batch itself). Same serialisation rule as the pure twin.
    """
    cdef int c = _check(s, max_body)
    return QUEUED if c == 0 else OPENED if c == 1 else FULL


cdef int _check(Stream s, Py_ssize_t max_body) except -1:
    # check, answering 0 (QUEUED), 1 (OPENED) or 2 (FULL).
    cdef list frames = s.frames
    cdef Py_ssize_t total = PyList_GET_SIZE(frames)
    cdef Py_ssize_t counted = s.counted
    cdef Py_ssize_t k, i, n, nbytes = 0
    cdef object p
    if counted == 0 and total == 1:
        # A batch opening with one message (the common case).
        p = <object>PyList_GET_ITEM(frames, 0)
        n = PyBytes_GET_SIZE(p) if type(p) is bytes else len(p)
        counted = s.counted = 1
        s.size = n + 1 if n < 255 else n + 9
    else:
        k = total - counted if total > counted else 0
        if k:
            for i in range(counted, total):
                p = <object>PyList_GET_ITEM(frames, i)
                nbytes += PyBytes_GET_SIZE(p) if type(p) is bytes else len(p)
            counted += k
            s.counted = counted
            # Framing: one byte a message, nine for long ones (judged by the average).
            s.size += nbytes + k * (1 if nbytes < 255 * k else 9)
        elif not total:
            return 0  # taken meanwhile: the next push opens a batch
    cdef Py_ssize_t size = s.size
    cdef Py_ssize_t avg = size // counted
    if avg == 0:
        avg = 1
    cdef Py_ssize_t limit = s.limit
    cdef Py_ssize_t room = max_body - size
    if size >= limit or avg > room:
        return 2
    cdef Py_ssize_t more = (limit - size + avg - 1) // avg
    if room // avg < more:
        more = room // avg
    s.check_at = counted + (more if more > 1 else 1)
    if s.armed == s.gen:
        return 0
    s.armed = s.gen
    return 1


def make_check(Py_ssize_t max_body):
    """:func:`check` for batches of at most ``max_body`` bytes: ``check(s)``."""

    def check_(Stream s):
        return check(s, max_body)

    return check_


def cut(list chunk, bytes head, seq, bytes ext, Py_ssize_t limit):
    """``chunk`` framed into datagrams of at most ``limit`` body bytes each
    (at least one message each), numbered from ``seq``: as ``Batcher.take``
    cuts a batch, byte for byte."""
    cdef Py_ssize_t count = PyList_GET_SIZE(chunk)
    cdef Py_ssize_t start = 0, end, body, n
    cdef object p
    cdef list out = []
    cdef unsigned long long sq = <unsigned long long>(seq & 0xFFFFFFFF)
    while start < count:
        end = start
        body = 0
        while end < count:
            p = <object>PyList_GET_ITEM(chunk, end)
            if type(p) is not bytes:
                raise TypeError("payloads must be bytes")
            n = PyBytes_GET_SIZE(p)
            n += 1 if n < 255 else LONG_PREFIX
            if end > start and body + n > limit:
                break
            body += n
            end += 1
        out.append(frame(chunk[start:end] if start or end < count else chunk, head, sq, ext))
        sq = (sq + 1) & 0xFFFFFFFF
        start = end
    return out


cdef list _take_cut(Stream s, BatcherState bs, double now, Py_ssize_t max_body):
    # Batcher.take of an unkeyed batcher on the compiled core (its _cut is cut).
    s.check_at = 1  # first: a push after the copy reaches check (see Batcher.take)
    cdef list frames = s.frames
    cdef list chunk = frames[:]
    cdef Py_ssize_t n = PyList_GET_SIZE(chunk)
    if n == 0:
        return []
    del frames[:n]
    s.gen += 1
    s.counted = s.size = 0
    s.last_send = now
    bs.messages_sent += n
    cdef list out = cut(chunk, <bytes?>s.head, s.seq, <bytes?>s.ext, max_body)
    cdef Py_ssize_t k = PyList_GET_SIZE(out), i, nbytes = 0
    s.seq = (s.seq + k) & 0xFFFFFFFF
    bs.datagrams_sent += k
    for i in range(k):
        nbytes += PyBytes_GET_SIZE(<object>PyList_GET_ITEM(out, i))
    bs.bytes_sent += nbytes
    return out


# -- the batches' deadlines ----------------------------------------------------


cdef struct _Deadline:
    double when
    unsigned long long order
    long long gen
    PyObject *stream  # a strong reference (see Deadlines)


cdef inline bint _before(const _Deadline *a, const _Deadline *b) noexcept nogil:
    return a.when < b.when or (a.when == b.when and a.order < b.order)


cdef class Deadlines:
    """The open batches' deadlines (as :class:`cmq.wire.batcher.Deadlines`).

    A binary heap of ``(deadline, tiebreak, stream, generation)`` entries
    in one C array: an open batch costs 32 bytes here, not a tuple the
    cycle collector walks. Entries come out in the same order as the pure
    twin's (deadlines, then the order of pushes). The array holds a strong
    reference to each entry's stream; the cycle collector does not see
    those references, so it counts them as references from outside and
    never frees a stream that has an entry here. That is safe because no
    cycle passes through the heap: a stream and its reliability state never
    refer to the batcher or its heap. Callers serialise every call but
    ``len`` (the driver's batch lock), as they do for the pure twin; the
    GIL is not what makes this safe.
    """

    cdef _Deadline *_a
    cdef Py_ssize_t _n
    cdef Py_ssize_t _cap
    cdef unsigned long long _order

    def __cinit__(self):
        self._a = NULL
        self._n = 0
        self._cap = 0
        self._order = 0

    def __dealloc__(self):
        cdef _Deadline *a = self._a
        cdef Py_ssize_t i, n = self._n
        self._a = NULL
        self._n = self._cap = 0
        for i in range(n):
            Py_XDECREF(a[i].stream)
        free(a)

    def __len__(self):
        """Entries, live or not (an upper bound on open batches)."""
        return self._n

    def push(self, double deadline, Stream s not None):
        """Add an entry for ``s``'s open batch (its current generation), due at ``deadline``."""
        cdef _Deadline e
        cdef _Deadline *a
        cdef Py_ssize_t i, parent, cap
        if self._n == self._cap:
            cap = self._cap * 2 if self._cap else 64
            a = <_Deadline *>realloc(self._a, cap * sizeof(_Deadline))
            if a == NULL:
                raise MemoryError()
            self._a = a
            self._cap = cap
        a = self._a
        e.when = deadline
        e.order = self._order
        e.gen = s.gen
        e.stream = <PyObject *>s
        Py_INCREF(s)
        self._order += 1
        i = self._n
        self._n += 1
        while i > 0:
            parent = (i - 1) >> 1
            if not _before(&e, &a[parent]):
                break
            a[i] = a[parent]
            i = parent
        a[i] = e

    cdef inline void _pop(self, _Deadline *top) noexcept:
        # Move the first entry (and its reference) to *top; the heap must not be empty.
        cdef _Deadline *a = self._a
        cdef Py_ssize_t i = 0, c, n
        top[0] = a[0]
        self._n -= 1
        n = self._n
        if n == 0:
            return
        cdef _Deadline last = a[n]
        while True:
            c = 2 * i + 1
            if c >= n:
                break
            if c + 1 < n and _before(&a[c + 1], &a[c]):
                c += 1
            if not _before(&a[c], &last):
                break
            a[i] = a[c]
            i = c
        a[i] = last

    cdef inline bint _live(self, const _Deadline *e):
        cdef Stream s = <Stream>e.stream
        return s.gen == e.gen and s.frames

    def first(self):
        """The earliest deadline of a live entry, or None; drops the dead entries above it."""
        cdef _Deadline top
        while self._n:
            if self._live(&self._a[0]):
                return self._a[0].when
            self._pop(&top)
            Py_XDECREF(top.stream)  # after the heap is whole again
        return None

    def pop_due(self, double now):
        """Pop every entry due at or before ``now``; returns the streams of the live ones, in order."""
        cdef _Deadline top
        cdef Stream s
        cdef list out = []
        while self._n and self._a[0].when <= now:
            self._pop(&top)
            s = <Stream>top.stream
            Py_XDECREF(top.stream)  # s holds its own reference
            if s.gen == top.gen and s.frames:
                out.append(s)
        return out

    def waiting(self):
        """The streams of entries whose stream has messages waiting, each once, by deadline."""
        cdef Py_ssize_t i
        cdef Stream s
        cdef list found = []
        for i in range(self._n):
            s = <Stream>self._a[i].stream
            if s.frames:
                found.append((self._a[i].when, self._a[i].order, s))
        found.sort(key=lambda entry: (entry[0], entry[1]))
        cdef dict seen = {}
        for entry in found:
            s = entry[2]
            if id(s) not in seen:
                seen[id(s)] = s
        return list(seen.values())


# -- the endpoint's, the receiver's and the batcher's hot state -----------------


cdef class EndpointState:
    """The fields of a :class:`cmq.Queue` (and of any endpoint) that a push
    to an idle destination and a blocking read touch, as C members: as
    :class:`ReceiverState`, for the endpoint's twin on the compiled core.
    An object whose ``__init__`` has not run yet reads as closed."""

    cdef public bint _closed, _big_reads, _io_delivered
    cdef public double _app_read_at, _rel_at, _rcvtimeo, _rcv_lo, _rcv_hi
    # The non-blocking poll's state (Queue._poll; DirectReader.poll_once).
    cdef public Py_ssize_t _empty_polls, _pause_after
    cdef public long long _got_at_poll

    def __cinit__(self):
        self._closed = True
        self._app_read_at = -INFINITY
        self._rel_at = INFINITY
        self._rcv_lo = INFINITY
        self._rcv_hi = -INFINITY


cdef class ReceiverState:
    """The fields of :class:`cmq.wire.receiver.Receiver` that every datagram
    reads or writes, as C members.

    On the compiled core a receiver is an object of Receiver's twin on this
    class (:func:`cmq._impl.new_object`): the receive paths below and the
    :class:`DirectReader` reach these fields directly, not through an
    attribute lookup and a new int object for each count. Python code reads
    and writes them as the ints, bools, dicts and deques the pure class
    holds. Every other field of the receiver stays in its ``__dict__``.
    """

    cdef public dict mailboxes, dropped, _rstreams, _owed, _expected
    cdef public object replies, controls
    cdef public Py_ssize_t _unchecked, _free, _max_queued
    cdef public long long messages_received, datagrams_received, bytes_received
    cdef public bint status_urgent, new_due


cdef class BatcherState:
    """The fields of :class:`cmq.wire.batcher.Batcher` that every datagram it
    sends and every blocking read touch (``waited_at`` and the three
    counters ``stats()`` reports), as C members: as :class:`ReceiverState`,
    for the batcher's twin on the compiled core."""

    cdef public double waited_at
    cdef public long long messages_sent, datagrams_sent, bytes_sent

    def __cinit__(self):
        self.waited_at = -INFINITY


cdef class SenderState:
    """The one field of :class:`cmq.wire.reliable.ReliableSender` that every
    reliable datagram sent reads and writes (``total``, the bytes all its
    streams hold), as a C member: as :class:`ReceiverState`, for the
    reliable sender's twin on the compiled core."""

    cdef public Py_ssize_t total


# -- the driver's locks ----------------------------------------------------------


cdef extern from "pythread.h":
    ctypedef void *PyThread_type_lock
    PyThread_type_lock PyThread_allocate_lock()
    void PyThread_free_lock(PyThread_type_lock)
    int PyThread_acquire_lock(PyThread_type_lock, int mode) nogil
    void PyThread_release_lock(PyThread_type_lock) nogil
    ctypedef enum PyLockStatus:
        PY_LOCK_FAILURE = 0
        PY_LOCK_ACQUIRED = 1
        PY_LOCK_INTR
    PyLockStatus PyThread_acquire_lock_timed(PyThread_type_lock, long long microseconds, int intr_flag) nogil
    long long PY_TIMEOUT_MAX


cdef class Lock:
    """A lock with :class:`threading.Lock`'s interface (``acquire(blocking=True,
    timeout=-1)``, ``release()``, ``locked()``, ``with``) over the
    interpreter's own lock type, the one ``threading.Lock`` wraps.

    A compiled-core queue's receive, batch and state locks are these: the
    compiled paths take and release them with a C call each
    (:meth:`try_acquire`, :meth:`acquire_wait`, :meth:`release_held`), not
    through ``acquire``'s argument parsing (six such calls a round trip
    were a twelfth of its instructions). A wait for the lock releases the
    GIL and runs the signal handlers when a signal interrupts it, as
    ``threading.Lock`` does; the lock itself does not rely on the GIL.
    """

    cdef PyThread_type_lock lock
    # Whether it is held: written by its holder only (after acquiring,
    # before releasing); read by locked() and release()'s check.
    cdef bint held

    def __cinit__(self):
        self.lock = PyThread_allocate_lock()
        if self.lock == NULL:
            raise MemoryError("cannot allocate a lock")

    def __dealloc__(self):
        if self.lock != NULL:
            if self.held:
                PyThread_release_lock(self.lock)
            PyThread_free_lock(self.lock)

    cdef inline bint try_acquire(self) noexcept:
        if PyThread_acquire_lock(self.lock, 0):
            self.held = True
            return True
        return False

    cdef bint _wait(self, long long us) except -1:
        # Blocking (us < 0: forever) with the GIL released; a signal runs
        # its handlers (which may raise) and the wait goes on for what is left.
        cdef PyLockStatus r
        cdef double end = _mono() + us / 1e6 if us > 0 else 0.0
        while True:
            with nogil:
                r = PyThread_acquire_lock_timed(self.lock, us, 1)
            if r == PY_LOCK_ACQUIRED:
                self.held = True
                return True
            if r != PY_LOCK_INTR:
                return False
            PyErr_CheckSignals()
            if us > 0:
                us = <long long>((end - _mono()) * 1e6)
                if us <= 0:
                    return self.try_acquire()

    cdef int acquire_wait(self) except -1:
        if not self.try_acquire():
            self._wait(-1)
        return 0

    cdef inline void release_held(self) noexcept:
        self.held = False
        PyThread_release_lock(self.lock)

    def acquire(self, bint blocking=True, double timeout=-1):
        """As :meth:`threading.Lock.acquire`: whether it was acquired.

        Raises:
            ValueError: a timeout with ``blocking`` false, or a negative one
                other than -1.
            OverflowError: a timeout over the platform's largest.
        """
        if not blocking:
            if timeout != -1:
                raise ValueError("can't specify a timeout for a non-blocking call")
            return self.try_acquire()
        if timeout < 0 and timeout != -1:
            raise ValueError("timeout value must be a non-negative number")
        if timeout * 1e6 > <double>PY_TIMEOUT_MAX:
            raise OverflowError("timeout value is too large")
        if self.try_acquire():
            return True
        if timeout == -1:
            return self._wait(-1)
        if timeout == 0:
            return False
        return self._wait(<long long>(timeout * 1e6) or 1)

    def release(self):
        """As :meth:`threading.Lock.release`.

        Raises:
            RuntimeError: it is not held.
        """
        if not self.held:
            raise RuntimeError("release unlocked lock")
        self.release_held()

    def locked(self):
        """Whether it is held."""
        return self.held

    def __enter__(self):
        self.acquire_wait()
        return True

    def __exit__(self, exc_type, exc, tb):
        if not self.held:
            raise RuntimeError("release unlocked lock")
        self.release_held()

    def __repr__(self):
        return f"<{'locked' if self.held else 'unlocked'} cmq._speedups.Lock object at {id(self):#x}>"


# -- framing -------------------------------------------------------------------


cdef inline unsigned char *_put_be32(unsigned char *p, unsigned long v) noexcept nogil:
    p[0] = (v >> 24) & 0xFF
    p[1] = (v >> 16) & 0xFF
    p[2] = (v >> 8) & 0xFF
    p[3] = v & 0xFF
    return p + 4


cdef inline unsigned char *_put_prefix(unsigned char *p, Py_ssize_t n) noexcept nogil:
    cdef int k
    cdef unsigned long long v
    if n < 255:
        p[0] = <unsigned char>n
        return p + 1
    p[0] = 0xFF
    v = <unsigned long long>n
    for k in range(8):
        p[1 + k] = (v >> (56 - 8 * k)) & 0xFF
    return p + LONG_PREFIX


cdef inline unsigned char *_put_head(unsigned char *w, bytes head, unsigned long sq, bytes ext) noexcept:
    # A stream's datagram up to its frames: head, seq (big-endian), ext.
    cdef Py_ssize_t hlen = PyBytes_GET_SIZE(head)
    cdef Py_ssize_t elen = PyBytes_GET_SIZE(ext)
    memcpy(w, PyBytes_AS_STRING(head), hlen)
    w = _put_be32(w + hlen, sq)
    if elen:
        memcpy(w, PyBytes_AS_STRING(ext), elen)
        w += elen
    return w


def frame(list payloads, bytes head, seq, bytes ext):
    """``head + seq (4 bytes, big-endian) + ext + frames`` in one allocation
    (as :func:`cmq.wire.frames.frame`): an untagged datagram of a stream.

    Raises:
        TypeError: a payload is not ``bytes`` (the caller falls back).
    """
    cdef Py_ssize_t count = PyList_GET_SIZE(payloads)
    cdef Py_ssize_t i, n, total
    cdef Py_ssize_t hlen = PyBytes_GET_SIZE(head)
    cdef Py_ssize_t elen = PyBytes_GET_SIZE(ext)
    cdef object p
    cdef unsigned long sq = <unsigned long>(seq & 0xFFFFFFFF)
    total = hlen + 4 + elen
    for i in range(count):
        p = <object>PyList_GET_ITEM(payloads, i)
        if type(p) is not bytes:
            raise TypeError("payloads must be bytes")
        n = PyBytes_GET_SIZE(p)
        total += n + (1 if n < 255 else LONG_PREFIX)
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char *w = _put_head(<unsigned char *>PyBytes_AS_STRING(out), head, sq, ext)
    for i in range(count):
        p = <object>PyList_GET_ITEM(payloads, i)
        n = PyBytes_GET_SIZE(p)
        w = _put_prefix(w, n)
        memcpy(w, PyBytes_AS_STRING(p), n)
        w += n
    return out


cdef bytes _frame_one(bytes head, unsigned long sq, bytes ext, bytes p):
    # frame([p], head, sq, ext) without the list: the idle rule's datagram.
    cdef Py_ssize_t n = PyBytes_GET_SIZE(p)
    out = PyBytes_FromStringAndSize(
        NULL, PyBytes_GET_SIZE(head) + 4 + PyBytes_GET_SIZE(ext) + n + (1 if n < 255 else LONG_PREFIX)
    )
    cdef unsigned char *w = _put_head(<unsigned char *>PyBytes_AS_STRING(out), head, sq, ext)
    w = _put_prefix(w, n)
    memcpy(w, PyBytes_AS_STRING(p), n)
    return out


cdef inline bint _idle(Stream s, double now, double waited_at, double idle_gap, double busy_gap) except -1:
    # Batcher.is_idle, for a batcher that is ever idle (idle_gap finite).
    cdef SendState st = None
    cdef double gap
    if s._rel is not None:
        st = <SendState?>s._rel
        if s.seq != st.sent_upto:
            return False  # datagrams wait for credit: never idle
    if s.last_send > waited_at:
        gap = busy_gap if st is not None and st.buf else idle_gap
        if not now - s.last_send >= gap:
            return False
    return True


cdef class TakeIdle:
    """``Batcher.take_idle`` of an unkeyed batcher (the idle rule's short
    path, with :meth:`cmq.wire.batcher.Batcher.is_idle` inline), made by
    :func:`make_take_idle`: ``take_idle(s, now)`` answers and changes what
    the pure method does, on a compiled :class:`Stream` whose reliable
    state, if any, is a :class:`SendState`. A message that is not
    ``bytes`` goes to ``fallback`` (the pure method). The batcher's
    settings are read once, when it is made; ``waited_at`` and the counters
    on every datagram, as the pure method does. Same serialisation rule as
    ``Batcher.take``. :class:`IdleAfter` calls it without a Python call."""

    cdef BatcherState bs
    cdef object fallback
    cdef bint never_idle
    cdef double idle_gap, busy_gap, timeout
    cdef Py_ssize_t qthresh

    def __init__(self, batcher, fallback):
        self.bs = batcher
        self.fallback = fallback
        self.never_idle = batcher._never_idle
        self.idle_gap = batcher._idle_gap
        self.busy_gap = batcher._busy_gap
        self.timeout = batcher._timeout
        self.qthresh = batcher._qthresh

    def __call__(self, Stream s, double now):
        return self.take(s, now)

    cdef object take(self, Stream s, double now):
        cdef list frames = s.frames
        cdef BatcherState bs = self.bs
        if PyList_GET_SIZE(frames) != 1 or s.armed == s.gen or self.never_idle:
            return None
        payload = <object>PyList_GET_ITEM(frames, 0)
        if type(payload) is not bytes:
            return self.fallback(s, now)
        if not _idle(s, now, bs.waited_at, self.idle_gap, self.busy_gap):
            return None
        if now - s.last_send >= self.timeout:
            s.limit = self.qthresh
        s.check_at = 1  # as take: before the message leaves the list
        del frames[0]
        s.gen += 1
        if s.counted:
            if s.sizes:
                s.sizes = []
            s.counted = s.size = 0
        s.last_send = now
        cdef unsigned long seq = s.seq
        s.seq = (seq + 1) & 0xFFFFFFFFUL
        data = _frame_one(s.head, seq, s.ext, <bytes>payload)
        bs.messages_sent += 1
        bs.datagrams_sent += 1
        bs.bytes_sent += PyBytes_GET_SIZE(data)
        return data


def make_take_idle(batcher, fallback):
    """The :class:`TakeIdle` of ``batcher`` (``Batcher.take_idle`` of an
    unkeyed batcher), ``fallback`` its pure method."""
    return TakeIdle(batcher, fallback)


cdef list _split(const unsigned char *b, Py_ssize_t i, Py_ssize_t end):
    # The frame payloads of b[i:end] (ProtocolError when one runs past end).
    cdef Py_ssize_t j
    cdef unsigned long long n
    cdef int k
    cdef list out = []
    while i < end:
        n = b[i]
        if n == 255:
            if i + LONG_PREFIX > end:
                raise ProtocolError("long frame length runs past the end")
            n = 0
            for k in range(8):
                n = (n << 8) | b[i + 1 + k]
            i += LONG_PREFIX
        else:
            i += 1
        if n > <unsigned long long>(end - i):
            raise ProtocolError("frame runs past the end of the datagram")
        j = i + <Py_ssize_t>n
        out.append(PyBytes_FromStringAndSize(<const char *>b + i, j - i))
        i = j
    return out


def split_frames(bytes data, Py_ssize_t start, Py_ssize_t end):
    """Split ``data[start:end]`` into frame payloads (as :func:`cmq.wire.frames.split_frames`).

    Raises:
        ProtocolError: a frame runs past ``end``.
    """
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    if start < 0:
        start = 0
    if end > size:
        end = size
    return _split(<const unsigned char *>PyBytes_AS_STRING(data), start, end)


# -- the receiver's fast path of reliable streams ----------------------------------


cdef inline unsigned long _be32(const unsigned char *p) noexcept nogil:
    return (<unsigned long>p[0] << 24) | (<unsigned long>p[1] << 16) | (<unsigned long>p[2] << 8) | p[3]


# -- control records (STATUS and PROBE) ---------------------------------------


cdef extern from "Python.h":
    int PyObject_GenericSetAttr(object o, object name, object value) except -1

# The record classes of cmq.wire.frames, looked up on first use (that module
# does not import this one at import time).
cdef object _StatusT = None
cdef object _ProbeT = None
cdef tuple _STATUS_FIELDS = ("stream_sender", "mailbox", "epoch", "next_expected", "credit_limit",
                             "largest_seen", "missing", "ack_delay", "reset", "probe")
cdef tuple _PROBE_FIELDS = ("mailbox", "epoch", "next_seq", "rflags", "serial")
cdef enum:
    REC_STATUS_ = 1
    REC_PROBE_ = 2
    S_RESET_ = 0x01
    S_ANSWER_ = 0x02
    STATUS_SIZE_ = 29
    RANGE_SIZE_ = 6
    SERIAL_SIZE_ = 2
    PROBE_SIZE_ = 16
    MAX_RANGES_ = 32


cdef int _record_types() except -1:
    global _StatusT, _ProbeT
    if _StatusT is None:
        from cmq.wire.frames import Probe, Status

        _StatusT, _ProbeT = Status, Probe
    return 0


cdef object _fill(object cls, tuple names, tuple values):
    # A frozen, slotted dataclass's object with these field values, set
    # through its slots (its __setattr__ refuses, as frozen): the object
    # its __init__ would make, without the keyword call.
    cdef object obj = cls.__new__(cls)
    cdef Py_ssize_t k
    for k in range(PyTuple_GET_SIZE(names)):
        PyObject_GenericSetAttr(obj, names[k], values[k])
    return obj


cdef inline unsigned int _be16(const unsigned char *p) noexcept nogil:
    return (<unsigned int>p[0] << 8) | p[1]


cdef inline void _put_be16(unsigned char *p, unsigned long v) noexcept nogil:
    p[0] = (v >> 8) & 0xFF
    p[1] = v & 0xFF


def decode_control(bytes data, Py_ssize_t start, Py_ssize_t end):
    """:func:`cmq.wire.frames.decode_control`: the control records in
    ``data[start:end]``, the same :class:`~cmq.wire.frames.Status` and
    :class:`~cmq.wire.frames.Probe` objects.

    Raises:
        ProtocolError: the same cases, with the same messages.
    """
    cdef const unsigned char *b = <const unsigned char *>PyBytes_AS_STRING(data)
    cdef Py_ssize_t i = start, n, head
    cdef unsigned int kind, flags
    cdef list out = []
    if start < 0 or end > PyBytes_GET_SIZE(data):
        raise ValueError("decode_control: start and end must lie within the data")
    _record_types()
    while i < end:
        kind = b[i]
        if kind == REC_STATUS_:
            if i + STATUS_SIZE_ > end:
                raise ProtocolError("STATUS record runs past the end")
            flags = b[i + 1]
            n = b[i + 28]
            head = i
            i += STATUS_SIZE_
            if i + n * RANGE_SIZE_ > end:
                raise ProtocolError("STATUS ranges run past the end")
            missing = _ranges(b + i, n)
            i += n * RANGE_SIZE_
            probe = 0
            if flags & S_ANSWER_:
                if i + SERIAL_SIZE_ > end:
                    raise ProtocolError("STATUS serial runs past the end")
                probe = _be16(b + i)
                i += SERIAL_SIZE_
            out.append(_fill(_StatusT, _STATUS_FIELDS, (
                _be32(b + head + 4), _be32(b + head + 8), _be32(b + head + 12), _be32(b + head + 16),
                _be32(b + head + 20), _be32(b + head + 24), missing, _be16(b + head + 2),
                bool(flags & S_RESET_), probe)))
        elif kind == REC_PROBE_:
            if i + PROBE_SIZE_ > end:
                raise ProtocolError("PROBE record runs past the end")
            out.append(_fill(_ProbeT, _PROBE_FIELDS, (
                _be32(b + i + 4), _be32(b + i + 8), _be32(b + i + 12), b[i + 1], _be16(b + i + 2))))
            i += PROBE_SIZE_
        else:
            raise ProtocolError(f"unknown control record type {kind}")
    return out


cdef tuple _ranges(const unsigned char *b, Py_ssize_t n):
    # The STATUS's missing ranges, as the pure decoder's tuple of (start, length).
    cdef list ranges = []
    cdef Py_ssize_t k
    for k in range(n):
        ranges.append((_be32(b + k * RANGE_SIZE_), _be16(b + k * RANGE_SIZE_ + 4)))
    return tuple(ranges)


cdef inline bint _u32(object v) except -1:
    # Whether v is an int the pure encoder packs as it is (">I"): 0 <= v < 2**32.
    return type(v) is int and 0 <= v <= 0xFFFFFFFF


def encode_control(records, sender, key=None):
    """:func:`cmq.wire.frames.encode_control`: one v2 control datagram
    carrying ``records``, byte for byte the pure function's. A record this
    twin does not take as it is (a tag to add, a field that is not a plain
    int in range, a record of another type) goes to the pure function,
    which gives the datagram or the error it gives."""
    cdef Py_ssize_t size = 16, k, nr
    cdef object r, rng
    _record_types()
    if key is not None or type(records) is not list or not _u32(sender):
        return _pure_encode(records, sender, key)
    for r in <list>records:
        if type(r) is _StatusT:
            if not (_u32(r.stream_sender) and _u32(r.mailbox) and _u32(r.epoch) and type(r.next_expected) is int
                    and type(r.credit_limit) is int and type(r.largest_seen) is int and type(r.ack_delay) is int
                    and type(r.probe) is int and type(r.missing) is tuple):
                return _pure_encode(records, sender, key)
            nr = min(PyTuple_GET_SIZE(r.missing), MAX_RANGES_)
            for k in range(nr):
                rng = r.missing[k]
                if not (type(rng) is tuple and PyTuple_GET_SIZE(rng) == 2 and type(rng[0]) is int
                        and type(rng[1]) is int and rng[1] >= 0):
                    return _pure_encode(records, sender, key)
            size += STATUS_SIZE_ + nr * RANGE_SIZE_ + (SERIAL_SIZE_ if r.probe else 0)
        elif type(r) is _ProbeT:
            if not (_u32(r.mailbox) and _u32(r.epoch) and type(r.next_seq) is int and type(r.rflags) is int
                    and 0 <= r.rflags <= 0xFF and type(r.serial) is int):
                return _pure_encode(records, sender, key)
            size += PROBE_SIZE_
        else:
            return _pure_encode(records, sender, key)
    out = PyBytes_FromStringAndSize(NULL, size)
    cdef unsigned char *w = <unsigned char *>PyBytes_AS_STRING(out)
    w[0] = 0xC3
    w[1] = 0x51
    w[2] = 2
    w[3] = 0x10  # FLAG_CONTROL
    _put_be32(w + 4, <unsigned long>sender)
    memset(w + 8, 0, 8)
    w += 16
    for r in <list>records:
        if type(r) is _StatusT:
            nr = min(PyTuple_GET_SIZE(r.missing), MAX_RANGES_)
            w[0] = REC_STATUS_
            w[1] = (S_RESET_ if r.reset else 0) | (S_ANSWER_ if r.probe else 0)
            _put_be16(w + 2, <unsigned long>min(max(r.ack_delay, 0), 0xFFFF))
            _put_be32(w + 4, <unsigned long>r.stream_sender)
            _put_be32(w + 8, <unsigned long>r.mailbox)
            _put_be32(w + 12, <unsigned long>r.epoch)
            _put_be32(w + 16, <unsigned long>(r.next_expected & 0xFFFFFFFF))
            _put_be32(w + 20, <unsigned long>(r.credit_limit & 0xFFFFFFFF))
            _put_be32(w + 24, <unsigned long>(r.largest_seen & 0xFFFFFFFF))
            w[28] = <unsigned char>nr
            w += STATUS_SIZE_
            for k in range(nr):
                rng = r.missing[k]
                _put_be32(w, <unsigned long>(rng[0] & 0xFFFFFFFF))
                _put_be16(w + 4, <unsigned long>min(rng[1], 0xFFFF))
                w += RANGE_SIZE_
            if r.probe:
                _put_be16(w, <unsigned long>(r.probe & 0xFFFF))
                w += SERIAL_SIZE_
        else:
            w[0] = REC_PROBE_
            w[1] = <unsigned char>r.rflags
            _put_be16(w + 2, <unsigned long>(r.serial & 0xFFFF))
            _put_be32(w + 4, <unsigned long>r.mailbox)
            _put_be32(w + 8, <unsigned long>r.epoch)
            _put_be32(w + 12, <unsigned long>(r.next_seq & 0xFFFFFFFF))
            w += PROBE_SIZE_
    return out


def status_of(RecvState rs, double now):
    """``RecvStream.status(rs, now)`` (:mod:`cmq.wire.reliable`) of a compiled
    receiving stream: the same :class:`~cmq.wire.frames.Status`, made
    without the keyword call; its missing ranges from ``rs.gaps()`` only
    when something after ``next`` arrived (else there are none)."""
    cdef double held_for = (now - rs.largest_at) * 1e6
    _record_types()
    missing = () if _seq_diff(rs.largest, rs.next) < 0 else rs.gaps()
    delay = <long long>held_for if -9e18 < held_for < 9e18 else int(held_for)
    return _fill(_StatusT, _STATUS_FIELDS, (
        rs.sender, rs.mailbox, rs.epoch, rs.next, rs.credit, rs.largest, missing, delay, False, rs.answer))


cdef object _pure_encode(records, sender, key):
    from cmq.wire.frames import encode_control as pure

    return pure(records, sender, key)


cdef inline long long _seq_diff(unsigned long long a, unsigned long long b) noexcept nogil:
    # a - b in 32-bit serial-number arithmetic (cmq.wire.reliable.seq_diff).
    return <long long>((a - b + 0x80000000ULL) & 0xFFFFFFFFULL) - 0x80000000LL


cdef class RecvState:
    """The fields of :class:`cmq.wire.reliable.RecvStream` as C members.

    The compiled core's receiving streams are this class with RecvStream's
    methods (:func:`cmq.wire.reliable.recv_stream_type`): the receive paths
    below read and write their fields directly, not through attribute
    lookups, which were a third of those paths' instructions. Numbers are
    C numbers (sequence numbers and ids of 32 bits, counts, times in
    seconds), flags C truth values; Python code reads them as the ints,
    floats and bools the pure class holds, so the receiver's Python code
    sees the same values whichever core made the stream.
    """

    cdef public object addr, held, seen, due
    cdef public unsigned long sender, mailbox, epoch, next, largest, credit, grant_seen
    cdef public Py_ssize_t held_bytes, last_size, win, since_status, bytes_since, answer
    cdef public double largest_at, avg_size, grant_at, last_active
    cdef public bint ordered, granted, urgent, gone


cdef inline void _next_arrived(ReceiverState rx, RecvState rs, unsigned long seq, Py_ssize_t size, double now,
                               Py_ssize_t status_bytes, double max_ack_delay) except *:
    # Receiver._next_arrived: rs's next datagram (seq, size bytes, nothing
    # held) was delivered; note the STATUS owed.
    cdef unsigned long nxt = (seq + 1) & 0xFFFFFFFFUL
    rx._unchecked += size
    rs.next = nxt
    rs.largest = seq
    rs.largest_at = now
    rs.last_active = now
    rs.avg_size += (size - rs.avg_size) * 0.125
    rs.last_size = size
    rs.since_status += 1
    rs.bytes_since += size
    cdef long long quarter = _seq_diff(rs.credit, nxt) // 4
    if rs.bytes_since >= status_bytes or rs.since_status >= (quarter if quarter > 1 else 1):
        rs.urgent = True
        rx.status_urgent = True
    elif rs.due is None:
        rs.due = now + max_ack_delay
        rx.new_due = True
    rx._owed[rs] = None  # keyed by the stream: an identity hash, no tuple to hash


cdef inline void _owe(ReceiverState rx, RecvState rs, double now, bint urgent, Py_ssize_t status_bytes,
                      double max_ack_delay) except *:
    # Receiver._owe: rs owes its sender a STATUS, now (urgent) or within max_ack_delay.
    rs.since_status += 1
    cdef long long quarter = _seq_diff(rs.credit, rs.next) // 4
    if urgent or rs.since_status >= (quarter if quarter > 1 else 1) or rs.bytes_since >= status_bytes:
        rs.urgent = True
        rx.status_urgent = True
    elif rs.due is None:
        rs.due = now + max_ack_delay
        rx.new_due = True
    rx._owed[rs] = None


cdef inline bint _arrived(RecvState rs, unsigned long seq, Py_ssize_t size, double now, bint past) noexcept:
    # Receiver._reliable's notes on a datagram it takes (delivered or held):
    # the largest seen and whether it opened a gap (only one ``past`` next
    # can), the sizes; returns whether it opened a gap.
    cdef bint new_gap = False
    if _seq_diff(seq, rs.largest) > 0:
        new_gap = past and _seq_diff(seq, rs.largest) > 1 and _seq_diff(rs.largest, rs.next) >= -1
        rs.largest = seq
        rs.largest_at = now
    rs.avg_size += (size - rs.avg_size) * 0.125
    rs.last_size = size
    rs.bytes_since += size
    return new_gap


cdef object _NO_ROOM = object()


cdef inline bint _room(ReceiverState rx, object mb, Py_ssize_t n) except -1:
    # Receiver._reliable's room check: n more messages fit in mailbox mb
    # (None: not made yet), or Receiver._fits lets the datagram in whole.
    return mb is None or mb.delivered - mb.consumed + n <= rx._max_queued or rx._fits(mb, n)


cdef object _frames(ReceiverState rx, const unsigned char *b, Py_ssize_t size):
    # A reliable v2 datagram's frames; None when it is malformed (counted,
    # as the general path's parser counts it).
    try:
        return _split(b, V2_HEAD, size)
    except ProtocolError:
        rx.dropped["malformed"] += 1
        return None


cdef object _frames_with_room(ReceiverState rx, const unsigned char *b, Py_ssize_t size, unsigned long mailbox):
    # _frames, when its mailbox has room for them all without
    # Receiver._fits; _NO_ROOM when the mailbox is that full (the general
    # path decides).
    payloads = _frames(rx, b, size)
    if payloads is None:
        return None
    mb = rx.mailboxes.get(mailbox)
    if mb is not None and mb.delivered - mb.consumed + PyList_GET_SIZE(payloads) > rx._max_queued:
        return _NO_ROOM
    return payloads


cdef class ReceiveV2:
    """The fast path of :meth:`cmq.wire.receiver.Receiver.datagram_received`
    for a plain v2 data datagram (untagged, no fragment, control or ack
    flag; the caller checked that, and counted the datagram):
    ``receive(rx, data, addr, now)``, made by :func:`make_receive_v2`.

    It does what the pure fast path does, byte for byte: when ``data`` is
    the next datagram of a known, credited stream with nothing held, within
    credit and the budget, its messages go to their mailbox as one
    ``chunk`` and the stream's acknowledgement bookkeeping is done
    (``_next_arrived``); it returns how many were delivered. While a gap
    is open in a known, credited stream, it also does what the general
    path (``Receiver._reliable``) does with a datagram within credit and
    the budget: holds one past the gap (ordered, ``hold``), delivers one
    at once (unordered), or delivers the one that fills the gap with what
    was held after it (``fill``). Otherwise it changes nothing and returns
    -1: the general path decides. ``status_bytes``
    and ``max_ack_delay`` are :mod:`cmq.wire.reliable`'s constants.
    :meth:`DatagramIO.deliver` calls it in C on the datagrams it read,
    where they lie (no bytes object for the datagram).
    """

    cdef object chunk, header
    cdef Py_ssize_t status_bytes
    cdef double max_ack_delay

    def __init__(self, chunk, Py_ssize_t status_bytes, double max_ack_delay):
        from cmq.wire.frames import Header  # here: frames imports this module's loader

        self.chunk = chunk
        self.header = Header
        self.status_bytes = status_bytes
        self.max_ack_delay = max_ack_delay

    def __call__(self, ReceiverState rx, bytes data, addr, double now):
        return self.run(rx, <const unsigned char *>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), addr, now)

    cdef Py_ssize_t run(self, ReceiverState rx, const unsigned char *b, Py_ssize_t size, object addr,
                        double now) except -2:
        cdef RecvState rs
        if size < V2_HEAD or b[0] != 0xC3 or b[1] != 0x51:
            return -1
        cdef unsigned int flags = b[3]
        cdef unsigned long sender = _be32(b + 4)
        cdef unsigned long mailbox = _be32(b + 8)
        cdef unsigned long seq = _be32(b + 12)
        cdef unsigned long epoch = _be32(b + 16)
        cdef unsigned int rflags = b[20]
        if mailbox & 0x80000000UL:
            return -1
        key = (addr, sender, mailbox)
        found = rx._rstreams.get(key)
        if found is None:
            return -1
        rs = <RecvState?>found
        # Receiver._next_plain
        if rs.epoch != epoch or rs.next != seq or not rs.granted or rs.held or rs.seen:
            if (rs.epoch != epoch or not rs.granted or flags & ~1U or rflags & ~(R_SYN_ | R_ORDERED_)
                    or _seq_diff(rs.credit, seq) <= 0 or rx._unchecked + size > rx._free):
                return -1  # over credit or near the budget (Receiver._full): the general path decides
            if not rs.ordered:
                return self.unordered(rx, rs, b, size, flags, sender, mailbox, seq, addr, now)
            if rs.next == seq:
                return self.fill(rx, rs, b, size, flags, sender, mailbox, seq, addr, now)
            return self.hold(rx, rs, b, size, flags, sender, mailbox, seq, epoch, rflags, now)
        if rx._unchecked + size > rx._free or rflags & ~(R_SYN_ | R_ORDERED_):
            return -1
        if _seq_diff(rs.credit, seq) <= 0:
            return -1
        try:
            payloads = _split(b, V2_HEAD, size)
        except ProtocolError:
            rx.dropped["malformed"] += 1
            return 0
        mb = rx.mailboxes.get(mailbox)
        if mb is None:
            mb = rx.mailbox(mailbox)
        cdef Py_ssize_t n = PyList_GET_SIZE(payloads)
        if not _room(rx, mb, n):
            return <Py_ssize_t>rx._overrun(rs, now)
        if flags:
            payloads = rx._decode_all(payloads)
            n = len(payloads)
        else:
            # A list of bytes that only its chunk will ever hold (takes copy
            # out of it): it can be in no cycle, so the cycle collector need
            # not walk it. Its young collections visited every message of
            # every chunk waiting in a mailbox, a twelfth of the receiver's
            # CPU at 512 B.
            PyObject_GC_UnTrack(<void *>payloads)
        mb.chunks.append(self.chunk(payloads, (addr, sender, mailbox, seq, None)))
        mb.delivered += n
        mb.nbytes += size
        rx.messages_received += n
        _next_arrived(rx, rs, seq, size, now, self.status_bytes, self.max_ack_delay)
        return n

    cdef Py_ssize_t hold(self, ReceiverState rx, RecvState rs, const unsigned char *b, Py_ssize_t size,
                         unsigned int flags, unsigned long sender, unsigned long mailbox, unsigned long seq,
                         unsigned long epoch, unsigned int rflags, double now) except -2:
        # Receiver._reliable for a datagram of an ordered stream past a gap,
        # within credit and the budget: held (decoded) until the gap fills,
        # as the general path holds it (run refused what is over credit or
        # near the budget). A duplicate, or one past twice the window,
        # changes nothing and returns -1.
        cdef long long off = _seq_diff(seq, rs.next)
        cdef dict held = rs.held
        cdef bint new_gap
        if off <= 0 or seq in held or seq in rs.seen or off >= 2 * <long long>rx._wmax:
            return -1
        payloads = _frames(rx, b, size)
        if payloads is None:
            return 0
        header = self.header(flags=flags, sender=sender, mailbox=mailbox, seq=seq, version=2, epoch=epoch,
                             rflags=rflags)
        rx._unchecked += size  # Receiver._full's count, short of the budget
        rs.last_active = now
        new_gap = _arrived(rs, seq, size, now, True)
        held[seq] = (size, header, payloads)
        rs.held_bytes += size
        rx._held_rel += size
        _owe(rx, rs, now, new_gap, self.status_bytes, self.max_ack_delay)
        return 0

    cdef Py_ssize_t fill(self, ReceiverState rx, RecvState rs, const unsigned char *b, Py_ssize_t size,
                         unsigned int flags, unsigned long sender, unsigned long mailbox, unsigned long seq,
                         object addr, double now) except -2:
        # Receiver._reliable for the datagram an ordered stream's gap waits
        # for (seq is next, datagrams are held): delivered, and after it
        # every held datagram that now follows in order, as the general
        # path does (run refused what is over credit or near the budget).
        # A mailbox without room changes nothing and returns -1: the general
        # path decides.
        payloads = _frames_with_room(rx, b, size, mailbox)
        if payloads is None or payloads is _NO_ROOM:
            return 0 if payloads is None else -1
        rs.last_active = now
        _arrived(rs, seq, size, now, False)
        rx._unchecked += size  # Receiver._full's count, short of the budget
        cdef Py_ssize_t n = self.deliver(rx, payloads, flags, addr, sender, mailbox, seq, size)
        cdef Py_ssize_t got, held_size
        cdef unsigned long nxt = (seq + 1) & 0xFFFFFFFFUL
        cdef dict held = rs.held
        cdef object entry, h, body
        while held:
            entry = held.get(nxt)
            if entry is None:
                break
            held_size, h, body = entry
            if type(body) is not list or h.flags & ~1U:
                got = rx._accept(rs, held_size, h, body, addr, now)  # a fragment: the general path's
            else:
                # Receiver._accept: never refused for the budget (the
                # datagram is held), but counted in it.
                if rx._unchecked + held_size <= rx._free:
                    rx._unchecked += held_size
                else:
                    rx._full(held_size)
                got = PyList_GET_SIZE(body)
                if not _room(rx, rx.mailboxes.get(mailbox), got):
                    got = -1
                else:
                    got = self.deliver(rx, body, h.flags, addr, sender, mailbox, nxt, held_size)
            del held[nxt]
            rs.held_bytes -= held_size
            rx._held_rel -= held_size
            if got < 0:
                # No room: dropped unacknowledged, an overrun the sender repairs.
                rx.overruns += 1
                break
            n += got
            nxt = (nxt + 1) & 0xFFFFFFFFUL
        rs.next = nxt
        _owe(rx, rs, now, False, self.status_bytes, self.max_ack_delay)
        return n

    cdef Py_ssize_t unordered(self, ReceiverState rx, RecvState rs, const unsigned char *b, Py_ssize_t size,
                              unsigned int flags, unsigned long sender, unsigned long mailbox, unsigned long seq,
                              object addr, double now) except -2:
        # Receiver._reliable for an unordered stream's datagram while a gap
        # is open: delivered at once, past the gap (noted as seen) or as the
        # datagram that fills it (next moves past what was seen), as the
        # general path does (run refused what is over credit or near the
        # budget). A duplicate, one past twice the window or a mailbox
        # without room changes nothing and returns -1: the general path decides.
        cdef long long off = _seq_diff(seq, rs.next)
        cdef set seen = rs.seen
        if off < 0 or seq in seen or off >= 2 * <long long>rx._wmax:
            return -1
        payloads = _frames_with_room(rx, b, size, mailbox)
        if payloads is None or payloads is _NO_ROOM:
            return 0 if payloads is None else -1
        rs.last_active = now
        cdef bint new_gap = _arrived(rs, seq, size, now, off > 0)
        rx._unchecked += size
        cdef Py_ssize_t n = self.deliver(rx, payloads, flags, addr, sender, mailbox, seq, size)
        cdef unsigned long nxt
        if off:
            seen.add(seq)
        else:
            nxt = (seq + 1) & 0xFFFFFFFFUL
            while nxt in seen:
                seen.discard(nxt)
                nxt = (nxt + 1) & 0xFFFFFFFFUL
            rs.next = nxt
        _owe(rx, rs, now, new_gap, self.status_bytes, self.max_ack_delay)
        return n

    cdef Py_ssize_t deliver(self, ReceiverState rx, list payloads, object flags, object addr, unsigned long sender,
                            unsigned long mailbox, unsigned long seq, Py_ssize_t size) except -2:
        # Receiver._deliver of a whole reliable datagram (its mailbox's room
        # was checked): decoded if it is MessagePack, appended as one chunk.
        if flags:
            payloads = rx._decode_all(payloads)
        else:
            PyObject_GC_UnTrack(<void *>payloads)  # as in run: only its chunk holds it
        mb = rx.mailboxes.get(mailbox)
        if mb is None:
            mb = rx.mailbox(mailbox)
        cdef Py_ssize_t n = PyList_GET_SIZE(payloads)
        if n <= 0:
            return 0
        mb.chunks.append(self.chunk(payloads, (addr, sender, mailbox, seq, None)))
        mb.delivered += n
        mb.nbytes += size
        rx.messages_received += n
        return n


def make_receive_v2(chunk, Py_ssize_t status_bytes, double max_ack_delay):
    """The :class:`ReceiveV2` of a receiver (``chunk``: the class its
    mailboxes hold; the other two: :mod:`cmq.wire.reliable`'s constants)."""
    return ReceiveV2(chunk, status_bytes, max_ack_delay)


cdef inline Py_ssize_t _lone_frame(const unsigned char *b, Py_ssize_t head, Py_ssize_t size) noexcept nogil:
    # cmq.wire.receiver._lone_frame: where the payload of b[:size] starts
    # when it is one frame filling the datagram after a head of ``head``
    # bytes (the frame's length prefix at b[head]); 0 if it is not.
    cdef Py_ssize_t body = size - (head + 1)
    cdef unsigned long long n = b[head]
    cdef unsigned long long long_n = 0
    cdef int k
    if n < 255:
        return head + 1 if n == <unsigned long long>body else 0
    if body < 8:
        return 0
    for k in range(8):
        long_n = (long_n << 8) | b[head + 1 + k]
    return head + 1 + 8 if long_n == <unsigned long long>(body - 8) else 0


cdef class ReceiveOne:
    """The latency path of :meth:`cmq.wire.receiver.Receiver.receive_one`,
    made by :func:`make_receive_one`: ``receive_one(rx, data, addr, now, mailbox)``.

    The twin of its pure cases, for a plain datagram (no flag but
    ``flag_msgpack``) of one frame for ``mailbox``: a v1 datagram (a
    best-effort stream's) whose sequence number is the one its stream
    expects next, or a v2 datagram (``Receiver._receive_one_v2``) that is the
    next of a known, credited stream with nothing held, within credit and
    the budget. It counts it, expects the next (v1) or does the stream's
    acknowledgement bookkeeping (v2, ``_next_arrived``) and returns
    ``(payload, meta)``. Otherwise, or when the payload does not decode
    (``unpack`` raises), it changes nothing and returns None: the general
    path decides.

    It remembers the last datagram's source: its address tuple (the very
    object: a :class:`DatagramIO` gives a peer's datagrams one), sender and
    mailbox, the key it made of them and, for a v2 datagram, the reliable
    stream it found. The next datagram from that source uses that key (and
    its numbers in the meta: no new tuple or ints) and that stream, without
    a lookup, unless the receiver has dropped the stream since: a stream
    leaves ``rx._rstreams`` only through ``Receiver._new_stream``, which
    marks it ``gone``. The :class:`DirectReader` calls it in C.
    """

    cdef object unpack
    cdef Py_ssize_t status_bytes
    cdef double max_ack_delay
    cdef unsigned int flag_msgpack
    cdef object last_addr, last_rx
    cdef unsigned long last_sender, last_mb
    cdef tuple last_key
    cdef RecvState last_rs

    def __init__(self, unpack, Py_ssize_t status_bytes, double max_ack_delay, unsigned int flag_msgpack):
        self.unpack = unpack
        self.status_bytes = status_bytes
        self.max_ack_delay = max_ack_delay
        self.flag_msgpack = flag_msgpack
        self.last_key = None

    def __call__(self, ReceiverState rx, bytes data, addr, double now, unsigned long mailbox):
        return self.receive(rx, data, addr, now, mailbox)

    cdef object receive(self, ReceiverState rx, bytes data, object addr, double now, unsigned long mailbox):
        cdef RecvState rs = None
        cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
        cdef const unsigned char *b = <const unsigned char *>PyBytes_AS_STRING(data)
        cdef Py_ssize_t head
        cdef tuple key
        if size <= V1_HEAD or b[0] != 0xC3 or b[1] != 0x51:
            return None
        cdef unsigned int version = b[2]
        if version == 2:
            # v2 datagrams longer than the header, extension and prefix.
            if size <= V2_HEAD + 1:
                return None
            head = V2_HEAD
        elif version == 1:
            head = V1_HEAD
        else:
            return None
        cdef unsigned int flags = b[3]
        if flags != 0 and flags != self.flag_msgpack:
            return None
        cdef unsigned long sender = _be32(b + 4)
        cdef unsigned long mb = _be32(b + 8)
        cdef unsigned long seq = _be32(b + 12)
        # receiver._lone_frame: one frame filling the datagram.
        cdef Py_ssize_t start = _lone_frame(b, head, size)
        if start == 0 or mb != mailbox:
            return None
        cdef bint same = (self.last_key is not None and addr is self.last_addr and sender == self.last_sender
                          and mb == self.last_mb and rx is self.last_rx)
        if same:
            key = self.last_key
        else:
            key = (addr, sender, mb)
            self.last_key = key
            self.last_addr = addr
            self.last_sender = sender
            self.last_mb = mb
            self.last_rx = rx
            self.last_rs = None
        if version == 2:
            if same and self.last_rs is not None and not self.last_rs.gone:
                rs = self.last_rs
            else:
                found = rx._rstreams.get(key)
                if found is None:
                    return None
                rs = <RecvState?>found
                self.last_rs = rs
            # Receiver._next_plain
            if rs.epoch != _be32(b + 16) or rs.next != seq or not rs.granted or rs.held or rs.seen:
                return None
            if rx._unchecked + size > rx._free or b[20] & ~(R_SYN_ | R_ORDERED_):
                return None
            if _seq_diff(rs.credit, seq) <= 0:
                return None
        else:
            expected = rx._expected.get(key)
            if expected is None or <unsigned long>expected != seq:
                return None
        payload = PyBytes_FromStringAndSize(<const char *>b + start, size - start)
        if flags:
            try:
                payload = self.unpack(payload)
            except Exception:
                return None
        rx.datagrams_received += 1
        rx.bytes_received += size
        rx.messages_received += 1
        if rs is not None:
            _next_arrived(rx, rs, seq, size, now, self.status_bytes, self.max_ack_delay)
        else:
            rx._expected[key] = (seq + 1) & 0xFFFFFFFFUL
        return payload, (addr, key[1], key[2], seq, None)


def make_receive_one(unpack, Py_ssize_t status_bytes, double max_ack_delay, unsigned int flag_msgpack):
    """A :class:`ReceiveOne` (the latency path of ``Receiver.receive_one``)."""
    return ReceiveOne(unpack, status_bytes, max_ack_delay, flag_msgpack)


# -- the reliable sender's per-datagram bookkeeping ------------------------------


cdef class SendState:
    """The fields of :class:`cmq.wire.reliable.SendStream` as C members.

    The compiled core's sending streams are this class with SendStream's
    methods (:func:`cmq.wire.reliable.send_stream_type`): :func:`reliable_clear`
    and :func:`make_reliable_sent`, called for every datagram a reliable
    stream sends, reach their fields without attribute lookups. Numbers and
    flags are C numbers and truth values, as in :class:`RecvState`.
    """

    cdef public object stream, addr, mailbox, buf, dead_at, pto_at, probed, suspects
    cdef public object loss_at, behind_since, wholes
    cdef public unsigned long epoch, una, sent_upto, credit, sampled
    cdef public Py_ssize_t nbytes, pto_count, unanswered, serial, awaiting
    cdef public bint ordered, syn


cdef inline bint _clear(SendState st, Py_ssize_t n) except -1:
    cdef unsigned long long first = (<unsigned long long>(<Stream?>st.stream).seq - <unsigned long long>n) & 0xFFFFFFFFULL
    if first != <unsigned long long>st.sent_upto:
        return False
    return _seq_diff(<unsigned long long>st.credit, (first + <unsigned long long>n) & 0xFFFFFFFFULL) >= 0


def reliable_clear(SendState st, Py_ssize_t n):
    """``ReliableSender.clear(st, n)`` (:mod:`cmq.wire.reliable`): whether
    the stream's ``n`` new datagrams may all go at once (within credit, none
    waiting before them)."""
    return _clear(st, n)


cdef class ReliableSent:
    """``ReliableSender.sent`` of a reliable sender, made by
    :func:`make_reliable_sent`: ``sent(st, datagrams, now)`` buffers the
    stream's new datagrams, which :func:`reliable_clear` let go, as sent
    once at ``now``, and arms the probe timeout (``rel._arm``) when none is
    armed. :class:`IdleAfter` books its one datagram through :meth:`one`,
    without a Python call or a list. As every method of the reliable
    sender, it runs under the driver's batch lock: nothing here relies on
    the GIL."""

    cdef SenderState rel

    def __init__(self, SenderState rel):
        self.rel = rel

    def __call__(self, SendState st, list datagrams, now):
        cdef Py_ssize_t n = PyList_GET_SIZE(datagrams)
        cdef unsigned long long seq = (<unsigned long long>(<Stream?>st.stream).seq - <unsigned long long>n) & 0xFFFFFFFFULL
        cdef dict buf = st.buf
        cdef Py_ssize_t i, added = 0
        cdef object d
        for i in range(n):
            d = <object>PyList_GET_ITEM(datagrams, i)
            buf[seq] = [d, now, 1]
            added += PyBytes_GET_SIZE(d) if type(d) is bytes else len(d)
            seq = (seq + 1) & 0xFFFFFFFFULL
        self._booked(st, seq, added, now)

    cdef int one(self, SendState st, bytes d, double now) except -1:
        cdef unsigned long long seq = (<unsigned long long>(<Stream?>st.stream).seq - 1ULL) & 0xFFFFFFFFULL
        cdef object stamp = now
        st.buf[seq] = [d, stamp, 1]
        self._booked(st, (seq + 1ULL) & 0xFFFFFFFFULL, PyBytes_GET_SIZE(d), stamp)
        return 0

    cdef int _booked(self, SendState st, unsigned long long upto, Py_ssize_t added, object now) except -1:
        st.nbytes += added
        self.rel.total += added
        st.sent_upto = upto
        if st.pto_at is None:
            self.rel._arm(st, now)
        return 0


def make_reliable_sent(SenderState rel):
    """The :class:`ReliableSent` of ``rel`` (``ReliableSender.sent``)."""
    return ReliableSent(rel)


cdef class IdleAfter:
    """The slow half of a push (``Endpoint._after_append``, given as
    ``after``) for its commonest case, in C, made by :func:`make_idle_after`:
    a push that opens a batch to an idle destination sends its one
    message's datagram at once.

    ``after_append(s, payload, r)`` does what ``_after_append`` does, through
    ``Batcher.advance``, ``take_idle``, ``Endpoint._emit`` and
    ``Queue._transmit``, when ``r`` is CHECK, ``s`` is a compiled
    :class:`Stream`, the endpoint ``ep`` is open, a reliable stream's send
    buffers are not full and, past the point where a push reads
    acknowledgements first (``ack_poll_at`` bytes of the stream's), the
    application read the socket (for them or for itself) less than
    ``ack_poll_gap`` seconds ago (``ep._app_read_at``: ``Queue._poll_acks``
    would return at once), the
    batch is being opened with one message and the destination is
    idle (the rule of ``batcher``'s ``is_idle``, checked before the lock is
    taken: a stream that streams opens its batches busy, and takes the pure
    path without taking the lock twice). Under ``lock`` (the batch lock):
    ``batcher.take_idle(s, now)``; if it gives a datagram, a best-effort stream's
    goes with ``sendto`` (``DatagramIO.send1``); a reliable stream's too
    when ``reliable_clear`` lets it (else ``ep._emit`` takes it, as the
    pure path would), then ``reliable_sent`` books it at the stamp taken
    before sending, a full buffer makes the next push take the slow half,
    and a probe timeout armed by it goes to ``rel_timer``. ``last_send`` is
    when the kernel took the datagram, refused or not. A refusal is
    counted (``ep._count_send_failure``) and raised as ``send_error`` makes
    it. Whenever ``take_idle`` gives nothing, or any condition above fails,
    ``after`` is called as it would have been, with nothing changed.
    The clock is CLOCK_MONOTONIC, which ``time.monotonic`` (``Queue._now``)
    reads too.

    The compiled parts it is given (a :class:`Lock`, a :class:`TakeIdle`,
    ``DatagramIO.send1``, a :class:`ReliableSent`) it calls in C; anything
    else through a Python call. The compiled push (:func:`make_push`) calls
    it in C too.

    When all of those parts are compiled and the batcher is unkeyed, a
    push past the same checks whose batch is not the idle rule's takes the
    busy half (``busy_run``) instead of ``after``: ``check``; a batch opened
    to a busy destination arms its deadline (``batcher.heap.push``, then
    ``ep._deadline_armed``); a full one (or one opened to an idle
    destination with more than one message) is taken and cut as
    ``Batcher.take`` does and, as one datagram within credit, sent and
    booked as above; several datagrams go to ``ep._transmit`` (best-effort)
    or ``ep._emit``, and so does one whose credit is closed.
    """

    cdef object after, ep, send_error, sendto, rel_timer, acquire, release, take_idle, reliable_sent
    cdef EndpointState es
    cdef SenderState rs
    cdef BatcherState bs
    cdef Lock lock
    cdef TakeIdle take
    cdef DatagramIO io
    cdef ReliableSent booker
    cdef bint never_idle, busy
    cdef double idle_gap, busy_gap, ack_poll_gap, timeout
    cdef Py_ssize_t ack_poll_at, send_buffer, send_total, max_body, qthresh
    cdef object heap_push, deadline_armed, transmit

    def __init__(self, ep, after, batcher, sendto, reliable_sent, lock, rel_timer, send_error, rel,
                 Py_ssize_t ack_poll_at, Py_ssize_t send_buffer, Py_ssize_t send_total,
                 double ack_poll_gap):
        self.ep = ep
        self.es = ep
        self.after = after
        self.rs = rel
        self.bs = batcher
        self.lock = lock if type(lock) is Lock else None
        self.acquire = lock.acquire
        self.release = lock.release
        self.take_idle = batcher.take_idle
        self.take = self.take_idle if type(self.take_idle) is TakeIdle else None
        self.sendto = sendto
        owner = getattr(sendto, "__self__", None)
        self.io = owner if type(owner) is DatagramIO and getattr(sendto, "__name__", "") == "send1" else None
        self.reliable_sent = reliable_sent
        self.booker = reliable_sent if type(reliable_sent) is ReliableSent else None
        self.rel_timer = rel_timer
        self.send_error = send_error
        self.never_idle = batcher._never_idle
        self.idle_gap = batcher._idle_gap
        self.busy_gap = batcher._busy_gap
        self.ack_poll_at = ack_poll_at
        self.send_buffer = send_buffer
        self.send_total = send_total
        self.ack_poll_gap = ack_poll_gap
        self.max_body = batcher._max_body
        self.qthresh = batcher._qthresh
        self.timeout = batcher._timeout
        self.heap_push = batcher.heap.push
        self.deadline_armed = getattr(ep, "_deadline_armed", None)
        self.transmit = ep._transmit
        # The busy half (see busy_run): an unkeyed batcher of this core, all
        # of whose parts above are compiled.
        self.busy = (batcher._cut is cut and self.take is not None and self.io is not None
                     and self.lock is not None and self.booker is not None
                     and self.deadline_armed is not None)

    def __call__(self, s_obj, payload, r):
        return self.run(s_obj, payload, r)

    cdef object run(self, s_obj, payload, r):
        cdef Stream s
        cdef SendState st = None
        cdef EndpointState es = self.es
        cdef double now
        cdef object d
        if r is not CHECK or type(s_obj) is not Stream or es._closed:
            return self.after(s_obj, payload, r)
        s = <Stream>s_obj
        cdef bint opening = not (s.armed == s.gen or PyList_GET_SIZE(s.frames) != 1 or self.never_idle)
        if not opening and not self.busy:
            return self.after(s_obj, payload, r)
        now = _mono()
        if s._rel is not None:
            st = <SendState?>s._rel
            if st.nbytes >= self.send_buffer or self.rs.total >= self.send_total:
                return self.after(s_obj, payload, r)  # full: the slow half waits or raises
            if st.nbytes >= self.ack_poll_at and now - es._app_read_at >= self.ack_poll_gap:
                return self.after(s_obj, payload, r)  # the slow half reads the acknowledgements
        # Not idle now (the rule again, under the lock, in take_idle): the
        # busy half (a stream that streams opens each batch here, not idle).
        if not opening or not _idle(s, now, self.bs.waited_at, self.idle_gap, self.busy_gap):
            if self.busy:
                return self.busy_run(s, st, now)
            return self.after(s_obj, payload, r)
        if self.lock is not None:
            self.lock.acquire_wait()
        else:
            self.acquire()
        try:
            d = self.take.take(s, now) if self.take is not None else self.take_idle(s, now)
            if d is None:
                d = False  # released below, then the pure path
            elif st is not None and not _clear(st, 1):
                self.ep._emit(s, [d], s.last_send)  # credit closed: it waits in the send buffer
            else:
                self.send_one(s, st, d)
        finally:
            if self.lock is not None:
                self.lock.release_held()
            else:
                self.release()
        if d is False:
            self.after(s_obj, payload, r)


    cdef int send_one(self, Stream s, SendState st, object d) except -1:
        # Send stream s's one new datagram d (the lock held), as Queue._transmit
        # does; a reliable stream's (within credit) is then booked at the stamp
        # taken before sending, as Endpoint._emit does.
        cdef object armed = None
        cdef double stamp = 0.0
        if st is not None:
            armed = st.pto_at
            stamp = _mono()
        try:
            if self.io is not None:
                self.io._send1(<bytes?>d, s.addr)
            else:
                self.sendto(d, s.addr)
        except OSError as exc:
            self.ep._count_send_failure(exc)
            raise self.send_error(exc, s.addr) from exc
        finally:
            s.last_send = _mono()
            if st is not None:
                if self.booker is not None and type(d) is bytes:
                    self.booker.one(st, <bytes>d, stamp)
                else:
                    self.reliable_sent(st, [d], stamp)
                if st.nbytes >= self.send_buffer or self.rs.total >= self.send_total:
                    s.check_at = 0  # Batcher.hold: the next push takes the slow half
                if armed is None and st.pto_at is not None:
                    self.rel_timer(st.pto_at)
        return 0

    cdef object busy_run(self, Stream s, SendState st, double now):
        # The busy half: what _after_append does through Batcher.advance
        # (check; a batch opened to a busy destination arms its deadline;
        # a full one, or one opened idle, is taken), Endpoint._emit and
        # Queue._transmit, once the checks of run() passed (open, not full,
        # no acknowledgements to read first), for a batch that is not the
        # idle rule's (that is run()'s). What is not the common case (the
        # credit closed, several datagrams at once) goes to the endpoint's
        # own _emit or _transmit, as from the pure path.
        cdef int c
        cdef list out
        cdef double deadline
        self.lock.acquire_wait()
        try:
            c = _check(s, self.max_body)
            if c == 0:
                return None  # QUEUED
            if c == 1:  # OPENED: Batcher.opened
                if self.never_idle or not _idle(s, now, self.bs.waited_at, self.idle_gap, self.busy_gap):
                    deadline = now + self.timeout  # Batcher.arm
                    self.heap_push(deadline, s)
                    self.deadline_armed(deadline)
                    return None
                if now - s.last_send >= self.timeout:
                    s.limit = self.qthresh
            elif now - s.last_send < self.timeout:  # FULL: Batcher.filled
                s.limit = s.limit * 2 if s.limit * 2 < self.max_body else self.max_body
            out = _take_cut(s, self.bs, now, self.max_body)
            if not out:
                return None
            if st is not None and not _clear(st, PyList_GET_SIZE(out)):
                self.ep._emit(s, out, s.last_send)  # credit closed: they wait in the send buffer
                return None
            if PyList_GET_SIZE(out) != 1:
                if st is None:
                    self.transmit(s, out)
                    return None
                self.ep._emit(s, out, s.last_send)
                return None
            self.send_one(s, st, <object>PyList_GET_ITEM(out, 0))
            return None
        finally:
            self.lock.release_held()


def make_idle_after(ep, after, batcher, sendto, reliable_sent, lock, rel_timer, send_error, rel,
                    Py_ssize_t ack_poll_at, Py_ssize_t send_buffer, Py_ssize_t send_total,
                    double ack_poll_gap):
    """The :class:`IdleAfter` of endpoint ``ep`` (its ``_after_append``'s
    commonest case in C; the arguments are its fields, see the class)."""
    return IdleAfter(ep, after, batcher, sendto, reliable_sent, lock, rel_timer, send_error, rel,
                     ack_poll_at, send_buffer, send_total, ack_poll_gap)


def release_acked(dict buf, unsigned long long seq, Py_ssize_t count):
    """``cmq.wire.reliable.release_acked``: remove the entries of ``buf``
    for the ``count`` seqs from ``seq`` on (those present); returns the bytes
    of their datagrams."""
    return _release_acked(buf, seq, count)


cdef Py_ssize_t _release_acked(dict buf, unsigned long long seq, Py_ssize_t count) except -1:
    cdef Py_ssize_t i, freed = 0
    cdef object e, d
    for i in range(count):
        e = buf.pop(seq & 0xFFFFFFFFULL, None)
        if e is not None:
            d = e[0]
            freed += PyBytes_GET_SIZE(d) if type(d) is bytes else len(d)
        seq += 1
    return freed


cdef class OnStatus:
    """``ReliableSender.on_status`` (:mod:`cmq.wire.reliable`) of a reliable
    sender, made with the sender and its pure method: ``on_status(rec, now)``
    gives what the pure method gives and changes what it changes.

    In C, the commonest STATUS: a plain report (a :class:`~cmq.wire.frames.Status`
    whose numbers are 32-bit) on a known stream, from its receiver, that
    names nothing missing, no reset, on a stream past its first credit
    (no SYN) with no PROBE awaiting its answer, and that does not ask for
    what it acknowledged before. The RTT sample (``_sample``) and the probe
    timeout (``_arm``) stay the sender's Python methods; the release of what
    it acknowledges, of what its credit lets go, and the bookkeeping are C.
    Every other report goes to the pure method. As every method of the
    reliable sender, it runs under the driver's batch lock.
    """

    cdef object rel, pure
    cdef SenderState rs

    def __init__(self, rel, pure):
        self.rel = rel
        self.rs = rel
        self.pure = pure

    def __call__(self, rec, now):
        cdef SendState st
        cdef unsigned long nxt, largest, credit
        cdef long long acked
        cdef Py_ssize_t freed
        cdef unsigned long seq
        cdef double t = now
        _record_types()
        rel = self.rel
        if type(rec) is not _StatusT:
            return self.pure(rec, now)
        found = rel.streams.get(rec.epoch)
        if not isinstance(found, SendState):
            return self.pure(rec, now)
        st = <SendState>found
        r_next, r_largest, r_credit = rec.next_expected, rec.largest_seen, rec.credit_limit
        if (rec.stream_sender != rel.sender_id or rec.mailbox != st.mailbox or rec.reset or rec.missing
                or st.awaiting or st.syn or not _u32(r_next) or not _u32(r_largest) or not _u32(r_credit)
                or type(rec.ack_delay) is not int or type(st.buf) is not dict):
            return self.pure(rec, now)
        nxt, largest, credit = r_next, r_largest, r_credit
        buf = <dict>st.buf
        if _seq_diff(nxt, st.una) < 0 and buf:
            return self.pure(rec, now)
        # ReliableSender.on_status, for this case, in its order.
        rel.status_received += 1
        st.behind_since = None
        st.unanswered = 0
        st.dead_at = None
        e = buf.get(r_largest)
        if e is not None and e[2] == 1 and e[1] is not None and _seq_diff(largest, st.sampled) > 0:
            st.sampled = largest
            rel._sample(t - <double>e[1], <double>rec.ack_delay * 1e-6)
        acked = _seq_diff(nxt, st.una)
        if acked > 0:
            if _seq_diff(nxt, st.sent_upto) > 0:
                acked = _seq_diff(st.sent_upto, st.una)
            if acked < 0:
                acked = 0
            freed = _release_acked(buf, st.una, <Py_ssize_t>acked)
            st.nbytes -= freed
            self.rs.total -= freed
            st.una = (st.una + <unsigned long>acked) & 0xFFFFFFFFUL
            if st.wholes and not buf:
                st.wholes.clear()
            st.pto_count = 0
        if _seq_diff(credit, st.credit) > 0:
            st.credit = credit
        # ReliableSender._release(arm=False): what the credit now lets go.
        out = []
        seq = st.sent_upto
        while _seq_diff(st.credit, seq) > 0:
            e = buf.get(seq)
            if e is None:
                break
            e[1] = now
            e[2] = 1
            out.append(e[0])
            seq = (seq + 1) & 0xFFFFFFFFUL
        st.sent_upto = seq
        if acked > 0 or out:
            st.pto_at = None
            if buf:
                rel._arm(st, now)
        elif st.pto_at is None and buf:
            rel._arm(st, now)
        return st, out


# -- many datagrams per system call ----------------------------------------------


cdef bint _malloc_tuned = False


def keep_freed_memory(int trim_threshold, int top_pad):
    """Ask glibc's malloc to keep up to ``trim_threshold`` bytes of freed
    memory in the process and to grow the heap ``top_pad`` bytes at a time.

    A reliable sender allocates a datagram per batch and frees it when it
    is acknowledged, often many at once: by default glibc hands that memory
    back to the kernel and the next datagrams fault it in again, page by
    page (measured: about half of the sender's page faults at 512 B). Done
    once per process, and not at all when the environment already sets
    ``MALLOC_TRIM_THRESHOLD_`` or ``MALLOC_TOP_PAD_`` (the caller checks).
    Returns whether this call changed the settings.
    """
    global _malloc_tuned
    if _malloc_tuned:
        return False
    _malloc_tuned = True
    mallopt(M_TRIM_THRESHOLD, trim_threshold)
    mallopt(M_TOP_PAD, top_pad)
    return True


cdef object _addr_tuple(sockaddr_storage *sa, socklen_t salen):
    cdef char text[64]
    cdef sockaddr_in *a4
    cdef sockaddr_in6 *a6
    if sa.ss_family == AF_INET:
        a4 = <sockaddr_in *>sa
        inet_ntop(AF_INET, &a4.sin_addr, text, sizeof(text))
        return (text.decode("ascii"), ntohs(a4.sin_port))
    if sa.ss_family == AF_INET6:
        a6 = <sockaddr_in6 *>sa
        inet_ntop(AF_INET6, &a6.sin6_addr, text, sizeof(text))
        return (text.decode("ascii"), ntohs(a6.sin6_port), ntohl(a6.sin6_flowinfo), a6.sin6_scope_id)
    return None


cdef int _fill_addr(object addr, sockaddr_storage *sa, socklen_t *salen) except -1:
    # addr as the socket module gives it: (host, port) or (host, port, flow, scope).
    cdef sockaddr_in *a4
    cdef sockaddr_in6 *a6
    host = addr[0]
    cdef bytes h = host.encode("ascii") if isinstance(host, str) else bytes(host)
    memset(sa, 0, sizeof(sockaddr_storage))
    if len(addr) == 2:
        a4 = <sockaddr_in *>sa
        if inet_pton(AF_INET, h, &a4.sin_addr) != 1:
            return 0
        a4.sin_family = AF_INET
        a4.sin_port = htons(<unsigned short>addr[1])
        salen[0] = sizeof(sockaddr_in)
        return 1
    a6 = <sockaddr_in6 *>sa
    if inet_pton(AF_INET6, h, &a6.sin6_addr) != 1:
        return 0
    a6.sin6_family = AF_INET6
    a6.sin6_port = htons(<unsigned short>addr[1])
    a6.sin6_flowinfo = htonl(<unsigned int>addr[2])
    a6.sin6_scope_id = <unsigned int>addr[3]
    salen[0] = sizeof(sockaddr_in6)
    return 1


# UDP segmentation offload (linux/udp.h): one send of many equal datagrams,
# and the receive side's coalesced reads (GRO) that are cut again here.
cdef enum:
    SOL_UDP_ = 17
    UDP_SEGMENT_ = 103
    UDP_GRO_ = 104
    # The most segments one GSO send carries (the kernel's UDP_MAX_SEGMENTS).
    GSO_MAX_SEGMENTS = 64
    # The most bytes one GSO send carries (an IP datagram's payload).
    GSO_MAX_BYTES = 65000
    CONTROL_SIZE = 64

cdef extern from "<sys/socket.h>" nogil:
    struct cmsghdr:
        size_t cmsg_len
        int cmsg_level
        int cmsg_type
    cmsghdr *CMSG_FIRSTHDR(msghdr *msgh)
    cmsghdr *CMSG_NXTHDR(msghdr *msgh, cmsghdr *cmsg)
    unsigned char *CMSG_DATA(cmsghdr *cmsg)
    size_t CMSG_LEN(size_t length)
    size_t CMSG_SPACE(size_t length)
    int setsockopt(int sockfd, int level, int optname, const void *optval, socklen_t optlen)


cdef class _AddrMemo:
    """The last source address read, and its tuple as the socket module
    gives it: a peer's datagrams share one tuple, made once."""

    cdef sockaddr_storage sa
    cdef socklen_t salen
    cdef object addr

    cdef object of(self, sockaddr_storage *sa, socklen_t salen):
        if salen != self.salen or memcmp(sa, &self.sa, salen) != 0:
            self.addr = _addr_tuple(sa, salen)
            memcpy(&self.sa, sa, salen)
            self.salen = salen
        return self.addr


cdef object _os_error(int err):
    # As the socket module raises it: errno and the system's text for it
    # (OSError picks the subclass: BlockingIOError, PermissionError, ...).
    return OSError(err, strerror(err).decode("utf-8", "replace"))


cdef class DatagramIO:
    """``recvmmsg``/``sendmmsg`` on one datagram socket, with UDP GSO and GRO.

    It owns ``fd``, a duplicate of the socket's descriptor (``os.dup``), so
    the socket stays open for a call in flight even when its owner closes
    it meanwhile, and the number can never name another file; :meth:`close`
    closes it (after which calls raise ``OSError(EBADF)``).

    ``slots`` datagrams of up to ``size`` bytes are read per call into
    buffers this object owns, so one reading thread at a time may use
    :meth:`recv` (the driver's receive lock); :meth:`send` may be called
    from any thread holding the driver's send lock. The GIL is released
    around every system call.

    Segmentation offload, where the kernel has it (Linux 4.18 for GSO, 5.0
    for GRO): :meth:`send` hands a run of equal-size datagrams to one
    destination to the kernel as one buffer that it cuts into datagrams
    (``UDP_SEGMENT``); with ``gro`` the socket accepts such runs coalesced
    (``UDP_GRO``) and :meth:`recv` cuts them again, so what comes out is
    always one bytes object per datagram sent. GRO is a property of the
    socket: with it on, every read of the socket must go through
    :meth:`recv` (a plain ``recvfrom`` would get a coalesced run as one
    datagram), which is why it is off unless asked for. A kernel that refuses either
    turns it off for this object, and the plain calls carry on
    (:attr:`gso` and :attr:`gro` say what is on).
    """

    cdef int fd
    cdef unsigned int slots
    cdef size_t size
    # One buffer of ``size`` bytes per slot (a bytes object owned here), read into.
    cdef PyObject **slabs
    cdef mmsghdr *msgs
    cdef iovec *iovs
    cdef sockaddr_storage *names
    cdef char *control
    # The send side's own vectors: a send and a read may run at once in two threads.
    cdef mmsghdr *smsgs
    cdef iovec *siovs
    cdef char *scontrol
    cdef public bint gso
    cdef public bint gro
    #: Reads the kernel coalesced (GRO) and this object cut again, and segmented sends (GSO), so far.
    cdef public unsigned long long coalesced
    # Reads that waited in recv1_within (a ppoll bounded by a timer).
    cdef readonly unsigned long long bounded_waits
    cdef public unsigned long long segmented
    # Datagrams read by read() that deliver() has not handed on yet.
    cdef unsigned int unread
    # The last source address read and its tuple: a peer's datagrams share one object.
    cdef _AddrMemo source
    # recv1's own buffer and source memo (a read of one datagram never
    # touches the slabs a recv of many may be using).
    cdef char *buf1
    cdef _AddrMemo source1
    # The last destination sent to (by identity) and its socket address.
    cdef object dest_addr
    cdef sockaddr_storage dest_sa
    cdef socklen_t dest_len

    def __cinit__(self, int fd, unsigned int slots=32, size_t size=65536, bint gso=True, bint gro=False):
        cdef int one = 1
        self.fd = fd
        self.slots = slots if slots > 0 else 1
        self.size = size
        self.slabs = <PyObject **>malloc(self.slots * sizeof(PyObject *))
        if self.slabs:
            memset(self.slabs, 0, self.slots * sizeof(PyObject *))
        self.msgs = <mmsghdr *>malloc(self.slots * sizeof(mmsghdr))
        self.iovs = <iovec *>malloc(self.slots * sizeof(iovec))
        self.names = <sockaddr_storage *>malloc(self.slots * sizeof(sockaddr_storage))
        self.control = <char *>malloc(self.slots * CONTROL_SIZE)
        self.smsgs = <mmsghdr *>malloc(self.slots * sizeof(mmsghdr))
        self.siovs = <iovec *>malloc(self.slots * GSO_MAX_SEGMENTS * sizeof(iovec))
        self.scontrol = <char *>malloc(self.slots * CONTROL_SIZE)
        self.buf1 = <char *>malloc(size)
        if (not self.slabs or not self.msgs or not self.iovs or not self.names or not self.control
                or not self.smsgs or not self.siovs or not self.scontrol or not self.buf1):
            raise MemoryError()
        cdef unsigned int i
        for i in range(self.slots):
            self.slabs[i] = _new_bytes(NULL, size)
            if self.slabs[i] == NULL:
                raise MemoryError()
        self.source = _AddrMemo()
        self.source1 = _AddrMemo()
        self.dest_addr = None
        self.dest_len = 0
        self.gso = gso
        # A coalesced read can be as large as a GSO send: only with whole-datagram buffers.
        self.gro = gro and size >= 65536 and setsockopt(fd, SOL_UDP_, UDP_GRO_, &one, sizeof(one)) == 0

    def close(self):
        """Close the descriptor (the socket closes with its last descriptor)."""
        if self.fd >= 0:
            close(self.fd)
            self.fd = -1

    def __dealloc__(self):
        cdef unsigned int i
        if self.fd >= 0:
            close(self.fd)
        if self.slabs:
            for i in range(self.slots):
                Py_XDECREF(self.slabs[i])
        free(self.slabs)
        free(self.msgs)
        free(self.iovs)
        free(self.names)
        free(self.control)
        free(self.smsgs)
        free(self.siovs)
        free(self.scontrol)
        free(self.buf1)

    def recv1(self, bint wait=False):
        """One datagram as ``(bytes, addr)``, as ``socket.recvfrom`` gives it.

        The read of a ping-pong or a request: one ``recvfrom``, without the
        argument parsing, address formatting and buffer slicing of the
        socket module's (a datagram from the same source as the last one
        gets the very same address tuple, which a dict lookup then matches
        by identity). Without ``wait`` it never blocks and keeps the GIL;
        with ``wait`` it blocks with the GIL released (SO_RCVTIMEO bounds
        it). One reading thread at a time (the driver's receive lock), as
        :meth:`recv`; the two have separate buffers. A datagram larger than
        ``size`` is cut to it, as ``recvfrom(size)`` would. A socket shut
        down gives ``(b"", None)``.

        Raises:
            OSError: the system call failed (BlockingIOError when nothing
                came: at once without ``wait``, after SO_RCVTIMEO with it).
        """
        return self._recv1(wait)

    cdef object _recv1(self, bint wait):
        cdef sockaddr_storage sa
        cdef socklen_t salen
        cdef ssize_t n
        cdef int err = 0
        cdef int fd = self.fd
        cdef char *buf = self.buf1
        cdef size_t size = self.size
        if fd < 0:
            raise _os_error(EBADF)
        while True:
            salen = sizeof(sockaddr_storage)
            sa.ss_family = 0
            if wait:
                with nogil:
                    n = recvfrom(fd, buf, size, 0, <sockaddr *>&sa, &salen)
                    if n < 0:
                        err = errno
            else:
                n = recvfrom(fd, buf, size, MSG_DONTWAIT, <sockaddr *>&sa, &salen)
                if n < 0:
                    err = errno
            if n >= 0:
                break
            if err != EINTR:
                raise _os_error(err)
            PyErr_CheckSignals()  # as the socket module: a handler may raise
        if salen == 0 or sa.ss_family == 0:
            return (PyBytes_FromStringAndSize(buf, n), None)
        return (PyBytes_FromStringAndSize(buf, n), self.source1.of(&sa, salen))

    def recv1_within(self, double seconds):
        """:meth:`recv1` of one datagram that comes within ``seconds``: a
        ``ppoll`` bounded to the nanosecond, then a read that cannot block,
        both with the GIL released once (the short wait of a reader whose
        next timer is due soon, which SO_RCVTIMEO would round up to a
        whole timer tick). ``seconds`` <= 0 reads without waiting.

        Raises:
            OSError: BlockingIOError when nothing came in time, or the
                system call failed.
        """
        return self._recv1_within(seconds)

    cdef object _recv1_within(self, double seconds):
        cdef pollfd p
        cdef timespec ts
        cdef double end, left
        cdef int r = 0, err = 0
        cdef int fd = self.fd
        if fd < 0:
            raise _os_error(EBADF)
        if seconds > 0.0:
            self.bounded_waits += 1
            end = _mono() + seconds
            left = seconds
            while True:
                p.fd = fd
                p.events = POLLIN
                p.revents = 0
                ts.tv_sec = <long>left
                ts.tv_nsec = <long>((left - <double>ts.tv_sec) * 1e9)
                with nogil:
                    r = ppoll(&p, 1, &ts, NULL)
                    if r < 0:
                        err = errno
                if r >= 0:
                    break
                if err != EINTR:
                    raise _os_error(err)
                PyErr_CheckSignals()  # as the socket module: a handler may raise
                left = end - _mono()
                if left <= 0.0:
                    break
            if r <= 0:
                raise _os_error(EAGAIN)
        return self._recv1(False)

    def recv(self, unsigned int limit=0, bint wait=False):
        """Up to ``limit`` (at most ``slots``) reads as ``[(bytes, addr), ...]``, one item per datagram sent.

        Without ``wait`` the call never blocks (and keeps the GIL: a read
        that cannot block is shorter than handing the interpreter to
        another thread and back); an empty list means nothing was there.
        With ``wait`` it blocks, with the GIL released, until at least one
        datagram arrives (the socket's timeout, SO_RCVTIMEO, bounds it). A
        read the kernel coalesced (GRO) gives several items. A socket shut
        down gives ``(b"", None)``.

        Raises:
            OSError: the system call failed (BlockingIOError on a timeout
                while waiting).
        """
        cdef unsigned int count = self.slots if limit == 0 or limit > self.slots else limit
        cdef unsigned int i
        cdef int got = self._read_many(count, wait)
        cdef list out = []
        cdef socklen_t namelen
        cdef size_t n, seg, off, part
        cdef const char *data
        for i in range(<unsigned int>got):
            namelen = self.msgs[i].msg_hdr.msg_namelen
            if namelen == 0:
                out.append((b"", None))
                continue
            addr = self.source.of(&self.names[i], namelen)
            n = self.msgs[i].msg_len
            data = PyBytes_AS_STRING(<object>self.slabs[i])
            seg = self._segment(i, True)
            off = 0
            while True:
                part = seg if seg <= n - off else n - off
                out.append((PyBytes_FromStringAndSize(data + off, part), addr))
                off += part
                if off >= n:
                    break
        return out

    cdef inline size_t _segment(self, unsigned int i, bint count) noexcept:
        # The size of each datagram in read i: the read's length, or the
        # segment size when the kernel coalesced several (GRO: the last may
        # be shorter), then counted in ``coalesced`` if ``count``.
        cdef size_t n = self.msgs[i].msg_len
        cdef size_t seg = _gro_size(&self.msgs[i].msg_hdr) if self.gro else 0
        if seg == 0 or seg >= n:
            return n
        if count:
            self.coalesced += 1
        return seg

    cdef int _read_many(self, unsigned int count, bint wait) except -1:
        # recvmmsg of up to count datagrams into the slabs; how many came (0:
        # none, without wait). The datagrams stay in self.msgs until the next read.
        cdef unsigned int i
        cdef int got, err = 0
        if self.fd < 0:
            raise _os_error(EBADF)
        memset(self.msgs, 0, count * sizeof(mmsghdr))
        for i in range(count):
            self.iovs[i].iov_base = PyBytes_AS_STRING(<object>self.slabs[i])
            self.iovs[i].iov_len = self.size
            self.msgs[i].msg_hdr.msg_iov = &self.iovs[i]
            self.msgs[i].msg_hdr.msg_iovlen = 1
            self.msgs[i].msg_hdr.msg_name = &self.names[i]
            self.msgs[i].msg_hdr.msg_namelen = sizeof(sockaddr_storage)
            self.names[i].ss_family = 0  # no address: a socket shut down (the tuple is None)
            if self.gro:
                self.msgs[i].msg_hdr.msg_control = self.control + i * CONTROL_SIZE
                self.msgs[i].msg_hdr.msg_controllen = CONTROL_SIZE
        if not wait:
            while True:
                got = recvmmsg(self.fd, self.msgs, count, MSG_DONTWAIT, NULL)
                if got >= 0 or errno != EINTR:
                    break
            if got < 0:
                err = errno
                if err == EAGAIN:  # EWOULDBLOCK on Linux
                    return 0
                raise _os_error(err)
        else:
            while True:
                with nogil:
                    # The first datagram blocks; the rest are only what is
                    # already there (MSG_WAITFORONE).
                    got = recvmmsg(self.fd, self.msgs, count, 0x10000, NULL)
                    if got < 0:
                        err = errno
                if got >= 0 or err != EINTR:
                    break
                PyErr_CheckSignals()  # as the socket module: a handler may raise
            if got < 0:
                raise _os_error(err)
        return got

    def read(self, unsigned int limit=0):
        """Read up to ``limit`` (at most ``slots``) datagrams without
        blocking, into this object's buffers, for :meth:`deliver` to hand
        on; returns how many datagrams were sent to us (a coalesced read
        counts each; 0: nothing was there). What an earlier read left
        undelivered is dropped. The thread rules of :meth:`recv`.

        Raises:
            OSError: the system call failed.
        """
        return self._read(limit)

    cdef unsigned int _read(self, unsigned int limit) except? 0xFFFFFFFF:
        # read(), callable from C (DirectReader.poll_once).
        cdef unsigned int count = self.slots if limit == 0 or limit > self.slots else limit
        self.unread = 0
        cdef int got = self._read_many(count, False)
        cdef unsigned int i, items = 0
        cdef size_t n, seg
        for i in range(<unsigned int>got):
            n = self.msgs[i].msg_len
            seg = self._segment(i, False)
            items += 1 if seg >= n else <unsigned int>((n + seg - 1) // seg)
        self.unread = <unsigned int>got
        return items

    def deliver(self, ReceiverState rx, ReceiveV2 fast, received, general, unsigned int slow,
                double now=NAN):
        """Hand the datagrams of the last :meth:`read` to receiver ``rx``,
        in order, as ``for data, addr in recv(): received(data, addr,
        now)`` would (``now``, unless given, read from the clock for each:
        CLOCK_MONOTONIC, as ``time.monotonic``), without a bytes object for a
        datagram that ``fast`` takes: one of reliable wire format v2
        whose flags have none of ``slow`` goes to ``fast`` where it lies,
        counted as ``Receiver.datagram_received`` counts it; if ``fast``
        declines it, to ``general(data, addr, now)``. Every other datagram
        goes to ``received``. With ``fast`` None (a keyed receiver), every
        one goes to ``received``. Returns False, or True when a read said
        the socket was shut down (the datagrams after it are not handed on).
        """
        cdef unsigned int i, got = self.unread
        cdef socklen_t namelen
        cdef size_t n, seg, off, part
        cdef const unsigned char *data
        cdef Py_ssize_t r
        cdef bint clock = isnan(now)
        self.unread = 0
        for i in range(got):
            namelen = self.msgs[i].msg_hdr.msg_namelen
            if namelen == 0:
                return True
            addr = self.source.of(&self.names[i], namelen)
            n = self.msgs[i].msg_len
            data = <const unsigned char *>PyBytes_AS_STRING(<object>self.slabs[i])
            seg = self._segment(i, True)
            off = 0
            while True:
                part = seg if seg <= n - off else n - off
                if clock:
                    now = _mono()
                if (fast is not None and part >= V2_HEAD and data[off + 2] == 2
                        and not data[off + 3] & slow):
                    rx.datagrams_received += 1
                    rx.bytes_received += <long long>part
                    r = fast.run(rx, data + off, <Py_ssize_t>part, addr, now)
                    if r < 0:
                        general(PyBytes_FromStringAndSize(<const char *>data + off, part), addr, now)
                else:
                    received(PyBytes_FromStringAndSize(<const char *>data + off, part), addr, now)
                off += part
                if off >= n:
                    break
        return False

    def send(self, list datagrams, addr):
        """Send ``datagrams`` (bytes) to ``addr`` in as few calls as possible; returns how many left.

        Runs of equal-size datagrams (the last of a run may be shorter) go
        as one segmented send each when GSO is on. Stops at the first
        datagram the kernel refuses and raises its error when none left at
        all; a caller compares the count with the list.

        Raises:
            OSError: the first datagram could not be sent.
            ValueError: ``addr`` is not a numeric IPv4 or IPv6 address.
        """
        cdef sockaddr_storage sa
        cdef socklen_t salen = 0
        if self.fd < 0:
            raise _os_error(EBADF)
        if not _fill_addr(addr, &sa, &salen):
            raise ValueError(f"not a numeric address: {addr!r}")
        # A tuple of our own: nothing can drop a datagram while the GIL is released.
        cdef tuple held = tuple(datagrams)
        cdef Py_ssize_t total = len(held)
        cdef Py_ssize_t done = 0, k, first, run_bytes
        cdef unsigned int groups, i, nseg, iov
        cdef int sent, err = 0
        cdef object d
        cdef Py_ssize_t n, seg
        cdef unsigned int counts[128]
        cdef unsigned int maxgroups = self.slots if self.slots < 128 else 128
        cdef cmsghdr *cm
        for k in range(total):
            if type(held[k]) is not bytes:
                raise TypeError("datagrams must be bytes")
        while done < total:
            # Group the datagrams: a run of one size (the last may be
            # shorter) to one segmented send, or one datagram per message.
            memset(self.smsgs, 0, maxgroups * sizeof(mmsghdr))
            groups = 0
            iov = 0
            k = done
            while k < total and groups < maxgroups:
                first = k
                seg = PyBytes_GET_SIZE(held[k])
                run_bytes = seg
                nseg = 1
                k += 1
                if self.gso and seg > 0:
                    while k < total and nseg < GSO_MAX_SEGMENTS:
                        n = PyBytes_GET_SIZE(held[k])
                        # An empty datagram cannot be a segment (it would vanish).
                        if n == 0 or n > seg or run_bytes + n > GSO_MAX_BYTES:
                            break
                        run_bytes += n
                        nseg += 1
                        k += 1
                        if n < seg:
                            break  # a shorter one ends the run
                for i in range(nseg):
                    d = held[first + i]
                    self.siovs[iov + i].iov_base = PyBytes_AS_STRING(d)
                    self.siovs[iov + i].iov_len = PyBytes_GET_SIZE(d)
                self.smsgs[groups].msg_hdr.msg_iov = &self.siovs[iov]
                self.smsgs[groups].msg_hdr.msg_iovlen = nseg
                self.smsgs[groups].msg_hdr.msg_name = &sa
                self.smsgs[groups].msg_hdr.msg_namelen = salen
                if nseg > 1:
                    self.smsgs[groups].msg_hdr.msg_control = self.scontrol + groups * CONTROL_SIZE
                    self.smsgs[groups].msg_hdr.msg_controllen = CMSG_SPACE(sizeof(unsigned short))
                    cm = CMSG_FIRSTHDR(&self.smsgs[groups].msg_hdr)
                    cm.cmsg_level = SOL_UDP_
                    cm.cmsg_type = UDP_SEGMENT_
                    cm.cmsg_len = CMSG_LEN(sizeof(unsigned short))
                    (<unsigned short *>CMSG_DATA(cm))[0] = <unsigned short>seg
                counts[groups] = nseg
                iov += nseg
                groups += 1
            # First without blocking and with the GIL (the common case: the
            # kernel takes them at once), then, if the buffer is full,
            # blocking with the GIL released.
            sent = sendmmsg(self.fd, self.smsgs, groups, MSG_DONTWAIT)
            if sent < 0:
                err = errno
                if err == EAGAIN:
                    with nogil:
                        sent = sendmmsg(self.fd, self.smsgs, groups, 0)
                        if sent < 0:
                            err = errno
            if sent < 0:
                if err == EINTR:
                    PyErr_CheckSignals()
                    continue
                if self.gso and counts[0] > 1 and (err == EINVAL or err == EIO or err == ENOPROTOOPT):
                    self.gso = False  # this kernel (or route) will not segment: plain sends from now on
                    continue
                if done == 0:
                    raise _os_error(err)
                return done
            for i in range(<unsigned int>sent):
                done += counts[i]
                if counts[i] > 1:
                    self.segmented += 1
            # Fewer than asked: the next call says why (or sends the rest).
        return done

    def ready(self):
        """Whether a datagram waits to be read (one system call, without blocking or a copy)."""
        cdef ssize_t got
        if self.fd < 0:
            return True  # a read says why
        got = recv(self.fd, NULL, 0, MSG_PEEK | MSG_DONTWAIT)
        return got >= 0 or errno != EAGAIN

    def send1(self, bytes data, addr):
        """Send one datagram to ``addr`` (as ``socket.sendto``, for an
        address this object was given before: no conversion).

        Tries without blocking and with the GIL first; a full send buffer
        waits with the GIL released.

        Raises:
            OSError: the kernel refused it.
            ValueError: ``addr`` is not a numeric IPv4 or IPv6 address.
        """
        self._send1(data, addr)

    cdef int _send1(self, bytes data, addr) except -1:
        cdef ssize_t sent
        cdef int err = 0
        cdef sockaddr_storage sa
        cdef socklen_t salen
        if self.fd < 0:
            raise _os_error(EBADF)
        # The cache is read and written with the GIL held, as a whole; the
        # send uses a copy, since another thread may change the cache while
        # this one waits in a blocking send without the GIL.
        if addr is not self.dest_addr:
            if not _fill_addr(addr, &self.dest_sa, &self.dest_len):
                self.dest_addr = None
                raise ValueError(f"not a numeric address: {addr!r}")
            self.dest_addr = addr
        memcpy(&sa, &self.dest_sa, self.dest_len)
        salen = self.dest_len
        cdef const char *p = PyBytes_AS_STRING(data)
        cdef size_t n = PyBytes_GET_SIZE(data)
        while True:
            sent = sendto(self.fd, p, n, MSG_DONTWAIT, <sockaddr *>&sa, salen)
            if sent >= 0:
                return 0
            err = errno
            if err == EAGAIN:
                with nogil:
                    sent = sendto(self.fd, p, n, 0, <sockaddr *>&sa, salen)
                    if sent < 0:
                        err = errno
                if sent >= 0:
                    return 0
            if err == EINTR:
                PyErr_CheckSignals()
                continue
            raise _os_error(err)


cdef size_t _gro_size(msghdr *msg) noexcept nogil:
    # The segment size of a coalesced read (UDP_GRO control message), or 0.
    cdef cmsghdr *cm = CMSG_FIRSTHDR(msg)
    while cm != NULL:
        if cm.cmsg_level == SOL_UDP_ and cm.cmsg_type == UDP_GRO_:
            return (<int *>CMSG_DATA(cm))[0]
        cm = CMSG_NXTHDR(msg, cm)
    return 0


# -- polling before a blocking read -------------------------------------------


#: A yield that took longer than this gave the CPU to another process.
cdef double _CROWDED = 3e-6


cdef int _spin_readable(int fd, double seconds) noexcept nogil:
    cdef pollfd p
    cdef int r = 0
    cdef double end, before, after
    p.fd = fd
    p.events = POLLIN
    end = _mono() + seconds
    while True:
        p.revents = 0
        if poll(&p, 1, 0) != 0:
            r = 1
            break
        before = _mono()
        if before >= end:
            break
        sched_yield()
        after = _mono()
        if after - before > _CROWDED:
            r = -1
            break
    return r


def spin_readable(int fd, double seconds):
    """Poll ``fd`` for input without blocking for up to ``seconds``,
    yielding the CPU between polls. Returns 1 as soon as it is readable
    (or reports an error: the read that follows says which), 0 when the
    time is up, -1 when a yield gave the CPU to another process (one that
    shares this CPU: polling only delays it). The GIL is released
    throughout (as :func:`cmq.net._sock.spin_readable`)."""
    cdef int r
    with nogil:
        r = _spin_readable(fd, seconds)
    return r


# -- a delivered message -------------------------------------------------------


cdef extern from "Python.h":
    object PyType_GenericAlloc(PyTypeObject *type, Py_ssize_t nitems)
    ctypedef struct PyMemberDef:
        Py_ssize_t offset
    ctypedef struct PyMemberDescrObject:
        PyMemberDef *d_member


#: The fields of cmq.Message, in the order message_of fills them.
_MESSAGE_FIELDS = ("payload", "sender", "sender_id", "mailbox", "seq", "correlation")


cdef class MessageOf:
    """:func:`cmq.net._base.message_of`, compiled: the :class:`cmq.Message`
    of a delivered ``(payload, (addr, sender, mailbox, seq, correlation))``
    item, made without a Python frame.

    ``Message`` is a frozen dataclass with slots. The pure function fills a
    new object's slots through their descriptors; this one writes the same
    references into the same slots, at the offsets the descriptors give
    (read once, here), into an object the type's own allocator made (zeroed,
    tracked by the cycle collector, as ``object.__new__`` makes it).

    Raises:
        TypeError: (when made) ``cls`` is not a class with those slots.
    """

    cdef object cls
    cdef Py_ssize_t offsets[6]

    def __init__(self, cls):
        from types import MemberDescriptorType

        for i, name in enumerate(_MESSAGE_FIELDS):
            descr = cls.__dict__.get(name)
            if type(descr) is not MemberDescriptorType:
                raise TypeError(f"{cls!r} has no slot {name!r}")
            self.offsets[i] = (<PyMemberDescrObject *><PyObject *>descr).d_member.offset
        self.cls = cls

    cdef object make(self, tuple item):
        cdef object payload = item[0]
        cdef tuple meta = <tuple?>item[1]
        cdef object m = PyType_GenericAlloc(<PyTypeObject *>self.cls, 0)
        cdef char *base = <char *><PyObject *>m
        cdef object v
        cdef Py_ssize_t i
        if PyTuple_GET_SIZE(meta) != 5:
            raise ValueError("a delivered item's meta has five fields")
        Py_INCREF(payload)
        (<PyObject **>(base + self.offsets[0]))[0] = <PyObject *>payload
        for i in range(5):
            v = meta[i]
            Py_INCREF(v)
            (<PyObject **>(base + self.offsets[i + 1]))[0] = <PyObject *>v
        return m

    def __call__(self, tuple item):
        return self.make(item)


# -- the latency path of a blocking read ---------------------------------------


cdef class DirectReader:
    """The twin of :class:`cmq.net._reader.DirectReader`: a queue's blocking
    read when nothing it waits for is queued, and the polling policy before
    it, with the policy's state in C members and the read's loop in C; and
    the queue's non-blocking read (:meth:`poll_once`, :meth:`pop_many`: the
    steps of ``Queue._poll`` and ``Queue._drain_many``, which have no pure
    twin in this class).

    It reads and writes the queue's attributes that change (``_closed``,
    ``_rel_at``, the SO_RCVTIMEO setting) as the pure one does, and calls
    the queue's own methods for what is rare (firing timers, a read bounded
    by select, setting SO_RCVTIMEO). The policy's constants are the pure
    module's, read when the reader is made. ``poll`` is called in C, with
    the GIL released, when it is this module's :func:`spin_readable`
    (tests set another callable: it is then called as Python).

    Thread safety does not rest on the GIL: :meth:`read` changes the
    policy's members only while it holds the queue's receive lock, which it
    takes without blocking (a reader that finds it taken leaves at once),
    as the pure reader does; the one other write, ``ahead = 0`` by a
    thread whose read timed out (``Queue._wait_item``), races at worst with
    a read's count, which only decides whether that read polls.
    """

    cdef public EndpointState queue
    cdef public object poll
    cdef public double spin_max, spin
    cdef public long spin_rest, crowded, crowded_rest, ahead, lockstep
    cdef public bint trial
    cdef public long long sent_seen, got_seen
    # What the queue holds for its lifetime.
    cdef object heap, sock
    # The queue's receive lock's and state lock's acquire and release, bound once.
    cdef object rx_acquire, rx_release, state_acquire, state_release
    # The same locks when they are the compiled core's (taken in C), else None.
    cdef Lock rx_lock, state_lock
    cdef BatcherState batcher
    cdef ReceiverState receiver
    cdef dict mailboxes
    cdef object c_poll
    # The queue's compiled reads (None: the socket module's, IPv6).
    cdef DatagramIO io
    # The receiver's compiled receive_one, when it has one and no key
    # (None: Receiver.receive_one decides).
    cdef object fast_one
    cdef ReceiveOne one  # fast_one when it is compiled (called in C), else None
    # Whether the queue's one-datagram read (_recv_small) is io's recv1 (called in C).
    cdef bint io_recv
    # cmq.wire.receiver.EMPTY, and the queue's compiled message_of.
    cdef object empty
    cdef MessageOf message_of
    # The poll's constants (cmq.net.queue, cmq.net._base, cmq.wire.receiver).
    cdef Py_ssize_t drain_batch, queue_sample
    cdef unsigned int mmsg_slots, v2_slow
    # The modules whose queue_delay and yield_cpu it calls, looked up at
    # each call (as the pure methods do: a test may replace them).
    cdef dict base_globals, queue_globals
    # The policy's constants (cmq.net._reader).
    cdef double short_wait, timer_slack, spin_floor
    cdef Py_ssize_t big_datagram
    cdef long direct_reads, spin_rest_n, crowded_off, crowded_rest_n, crowded_rest_max
    cdef long ahead_poll, ahead_cap, lockstep_n

    def __init__(self, queue, double spin_max, poll):
        from cmq.net import _reader as R

        self.queue = queue
        self.poll = poll
        self.c_poll = spin_readable
        self.heap = queue._heap
        self.rx_acquire = getattr(queue._rx_lock, "acquire", None)
        self.rx_release = getattr(queue._rx_lock, "release", None)
        self.state_acquire = getattr(queue._state_lock, "acquire", None)
        self.state_release = getattr(queue._state_lock, "release", None)
        self.rx_lock = queue._rx_lock if type(queue._rx_lock) is Lock else None
        self.state_lock = queue._state_lock if type(queue._state_lock) is Lock else None
        self.mailboxes = queue._mailboxes
        self.batcher = queue._batcher
        self.receiver = queue._receiver
        self.sock = queue._sock
        self.io = getattr(queue, "_mmsg", None)
        rx = self.receiver
        from cmq.wire.receiver import EMPTY

        self.empty = EMPTY
        shared = getattr(queue, "_message_of", None)  # the endpoint's own, on the compiled core
        if isinstance(shared, MessageOf):
            self.message_of = shared
        else:
            from cmq._types import Message

            self.message_of = MessageOf(Message)
        self.fast_one = getattr(rx, "_fast_one", None) if getattr(rx, "_key", None) is None else None
        self.one = self.fast_one if type(self.fast_one) is ReceiveOne else None
        small = getattr(queue, "_recv_small", None)
        self.io_recv = (self.io is not None and getattr(small, "__self__", None) is self.io
                        and getattr(small, "__name__", "") == "recv1")
        from cmq.net import _base
        from cmq.net import queue as queue_module
        from cmq.net.queue import _DRAIN_BATCH, _MMSG_SLOTS
        from cmq.wire.receiver import _V2_SLOW

        self.drain_batch = _DRAIN_BATCH
        self.mmsg_slots = _MMSG_SLOTS
        self.queue_sample = _base._QUEUE_SAMPLE
        self.v2_slow = _V2_SLOW
        self.base_globals = vars(_base)
        self.queue_globals = vars(queue_module)
        self.short_wait = R.SHORT_WAIT
        self.timer_slack = R.TIMER_SLACK
        self.spin_floor = R.SPIN_FLOOR
        self.big_datagram = R.BIG_DATAGRAM
        self.direct_reads = R.DIRECT_READS
        self.spin_rest_n = R.SPIN_REST
        self.crowded_off = R.CROWDED_OFF
        self.crowded_rest_n = R.CROWDED_REST
        self.crowded_rest_max = R.CROWDED_REST_MAX
        self.ahead_poll = R.AHEAD_POLL
        self.ahead_cap = R.AHEAD_CAP
        self.lockstep_n = R.LOCKSTEP
        self.spin_max = spin_max
        self.spin = spin_max
        self.spin_rest = 0
        self.crowded = 0
        self.crowded_rest = self.crowded_rest_n
        self.ahead = 0
        self.lockstep = 0
        self.trial = False
        self.sent_seen = 0
        self.got_seen = 0

    cdef inline int _lock_state(self) except -1:
        # The queue's state lock (see Endpoint._state_lock), in C when it is this module's.
        if self.state_lock is not None:
            self.state_lock.acquire_wait()
        else:
            self.state_acquire()
        return 0

    cdef inline int _unlock_state(self) except -1:
        if self.state_lock is not None:
            self.state_lock.release_held()
        else:
            self.state_release()
        return 0

    cdef int _poll(self, double seconds) except? -2:
        cdef int fd = self.sock.fileno()
        cdef int r
        if self.poll is self.c_poll:
            with nogil:
                r = _spin_readable(fd, seconds)
            return r
        return self.poll(fd, seconds)

    cdef int _reads_again(self, EndpointState q) except -1:
        # As Queue.get: a message the I/O thread read was taken, so the
        # application reads again and the I/O thread leaves the socket to
        # it (see Queue._io_loop); the next read takes the latency path.
        if q._io_delivered:
            q._io_delivered = False
            q._app_read_at = _mono()
        return 0

    def get(self, timeout=None, mailbox=0):
        """:meth:`cmq.Queue.get` of the compiled core, which a queue takes as
        its own ``get``: the next message of ``mailbox``, waiting up to
        ``timeout`` seconds (None: forever). The same steps as the pure
        method, without its Python frame.

        Raises:
            Timeout: nothing arrived in time.
            Closed: the queue was closed.
        """
        cdef EndpointState q = self.queue
        mb = self.mailboxes.get(mailbox)
        if mb is not None and mb.chunks:
            payload = mb.pop()
            if payload is not self.empty:
                self._reads_again(q)
                return payload
        item, left = self._read(timeout, mailbox)
        if item is not None:
            return item[0]
        return q._wait_item(mailbox, left, None, timeout)[0]

    def get_message(self, timeout=None, mailbox=0):
        """:meth:`cmq.Queue.get_message` of the compiled core: :meth:`get`'s
        steps, giving the :class:`cmq.Message` (and raising as it does)."""
        cdef EndpointState q = self.queue
        mb = self.mailboxes.get(mailbox)
        if mb is not None and mb.chunks:
            item = mb.pop_item()
            if item is not None:
                self._reads_again(q)
                return self.message_of.make(item)
        item, left = self._read(timeout, mailbox)
        if item is None:
            item = q._wait_item(mailbox, left, None, timeout)
        return self.message_of.make(item)

    def read(self, timeout, mailbox):
        """The latency path of a blocking read: ``(item or None, the timeout left)``
        (see :meth:`cmq.net._reader.DirectReader.read`)."""
        return self._read(timeout, mailbox)

    def pop_many(self, Py_ssize_t limit=1 << 30, mailbox=0):
        """:meth:`cmq.Queue.pop_many` of the compiled core, which a queue
        with compiled reads takes as its own: the same steps as
        ``Endpoint.pop_many`` and ``_filled_mailbox``, without their frames.

        Raises:
            Closed: the queue was closed and nothing is left.
        """
        mb = self.mailboxes.get(mailbox)
        if mb is None or not mb.available():
            self.poll_once()
            mb = self.mailboxes.get(mailbox)
            if mb is None or not mb.available():
                if self.queue._closed:
                    raise Closed("queue is closed")
                return []
        return mb.take(limit)

    def poll_once(self):
        """``Queue._poll`` of a queue with compiled reads, which it takes as
        its own: drain what the kernel holds without blocking, unless
        another thread is reading (``Queue._drain_many``'s loop, here in
        C), then count the polls that found nothing and yield the CPU after
        ``_pause_after`` of them in a row (see ``Queue._poll``)."""
        cdef EndpointState q = self.queue
        cdef Py_ssize_t got = 0
        cdef long long seen
        q._app_read_at = _mono()
        if not q._closed:
            if self.rx_lock is not None:
                if self.rx_lock.try_acquire():
                    try:
                        got = self._drain(self.drain_batch, q._backlog)
                    finally:
                        self.rx_lock.release_held()
            elif self.rx_acquire(False):
                try:
                    got = self._drain(self.drain_batch, q._backlog)
                finally:
                    self.rx_release()
        if got:
            q._empty_polls = 0
            return None
        seen = q._got_at_poll
        q._got_at_poll = self.receiver.messages_received
        q._empty_polls = 1 if seen != q._got_at_poll else q._empty_polls + 1
        if q._empty_polls > q._pause_after:
            self.queue_globals["yield_cpu"]()
        return None

    cdef Py_ssize_t _queued(self) except -1:
        # Receiver.queued's loop, in C: calling the method instead made an
        # empty pop_many about 200 ns slower (1,050 against 1,260 ns here).
        cdef Py_ssize_t n = 0
        for v in list(self.receiver.mailboxes.values()):
            n += v.delivered - v.consumed
        return n

    cdef Py_ssize_t _drain(self, Py_ssize_t limit, Py_ssize_t backlog) except -1:
        # Queue._drain_many(limit, backlog), the receive lock held: read up
        # to limit datagrams, one per call once half the backlog waits, and
        # stop at the backlog; then Endpoint._note_read and _after_read,
        # which is skipped when it has nothing to do.
        cdef EndpointState q = self.queue
        cdef ReceiverState rx = self.receiver
        cdef DatagramIO io = self.io
        cdef Py_ssize_t half = backlog // 2, count = 0, queued
        cdef unsigned int want, got
        cdef double now
        received = rx.datagram_received
        general = rx._general
        fast = rx._fast_v2 if rx._key is None else None
        while count < limit:
            queued = self._queued()
            if queued >= half:
                want = 1
            else:
                want = <unsigned int>(limit - count if limit - count < self.mmsg_slots else self.mmsg_slots)
                if backlog - queued < want:
                    want = <unsigned int>(backlog - queued)  # no more than the backlog has room for
            try:
                got = io._read(want)
            except OSError:
                if q._closed:
                    break
                continue  # e.g. an ICMP error reported on the socket: nothing to read
            if got >= self.queue_sample:
                rx.queue_delay = self.base_globals["queue_delay"](self.sock.fileno())
            elif got:
                rx.queue_delay = 0.0
            if not got:
                break
            self._lock_state()
            try:
                shut = io.deliver(rx, fast, received, general, self.v2_slow)
            finally:
                self._unlock_state()
            if shut:
                break  # shut down by close()
            count += got
            if self._queued() >= backlog:
                break
            if got < want:
                break  # the socket was empty (see Queue._drain_many)
            if rx.status_urgent:
                q._after_read(_mono())  # a STATUS owed now leaves with these datagrams
        now = _mono()
        if rx.replies or rx.controls or rx.status_urgent or rx.new_due or now >= q._rel_at:
            q._after_read(now)
        return count

    cdef tuple _read(self, object timeout, object mailbox):
        cdef EndpointState q = self.queue
        cdef ReceiverState rx
        cdef double start, now, deadline = 0.0, left = 0.0, wait = 0.0, rel_at, rleft
        cdef bint bounded = timeout is not None
        cdef bint has_wait, awaits, polls, found
        cdef long i
        if self.heap:
            return None, timeout
        if self.rx_lock is not None:
            if not self.rx_lock.try_acquire():
                return None, timeout
        elif not self.rx_acquire(False):
            return None, timeout
        # The application reads: the I/O thread leaves the socket to it.
        start = now = _mono()
        q._app_read_at = now
        if bounded:
            deadline = start + <double>timeout
        awaits = polls = self.spin_max != 0.0 and self._awaits()
        try:
            for i in range(self.direct_reads):
                mb = self.mailboxes.get(mailbox)  # again: another reader may have filled it
                if q._closed or self.heap or (mb is not None and mb.chunks and mb.available()):
                    break
                rel_at = q._rel_at
                if now >= rel_at:
                    q._fire_reliable(now)
                    rel_at = q._rel_at
                if bounded:
                    left = deadline - now
                    if left <= 0.0:
                        break
                # Queue._rel_bound: a reliability timer due first bounds the wait.
                rleft = rel_at - now
                if rleft < INFINITY and (not bounded or rleft < left):
                    has_wait = True
                    wait = rleft if rleft > self.timer_slack else self.timer_slack
                else:
                    has_wait = bounded
                    wait = left
                found = False
                if polls:
                    if self.trial:
                        self.trial = False
                        found = polls = self._trial_poll(has_wait, wait)
                    else:
                        found = polls = self._poll_first(has_wait, wait)
                try:
                    if q._big_reads or (
                        not found
                        and has_wait
                        and wait < self.short_wait
                        and not (awaits and self.crowded_rest > self.crowded_rest_n)
                    ):
                        if self.io is not None and has_wait and not q._big_reads:
                            # Queue._recv_within's short wait, in one call (see DatagramIO.recv1_within).
                            data, addr = self.io._recv1_within(wait)
                            if PyBytes_GET_SIZE(data) >= self.big_datagram:
                                q._big_reads = True
                        else:
                            data, addr = q._recv_within(wait if has_wait else None)
                    else:
                        if not has_wait:
                            if q._rcvtimeo:
                                q._set_rcvtimeo(None)
                        elif not (q._rcv_lo <= wait <= q._rcv_hi):
                            q._set_rcvtimeo(wait)
                        if self.io_recv:
                            data, addr = self.io._recv1(True)
                        else:
                            data, addr = q._recv_small(True)
                        if PyBytes_GET_SIZE(data) >= self.big_datagram:
                            q._big_reads = True
                except OSError:
                    addr = None  # timed out, closed, or an ICMP error
                if addr is not None:
                    now = _mono()
                    q._app_read_at = now
                    self.batcher.waited_at = now
                    self._lock_state()
                    try:
                        if self.fast_one is not None:
                            # Receiver.receive_one's first case, without its Python frame.
                            if self.one is not None:
                                item = self.one.receive(self.receiver, <bytes?>data, addr, now, mailbox)
                            else:
                                item = self.fast_one(self.receiver, data, addr, now, mailbox)
                            if item is None:
                                self.receiver.datagram_received(data, addr, now)
                        else:
                            item = self.receiver.receive_one(data, addr, now, mailbox)
                    finally:
                        self._unlock_state()
                    if item is not None:
                        # The timers due wait for this thread's next read.
                        # Endpoint._after_read(now, fire=False) has nothing
                        # to do unless one of these is set: its call is
                        # skipped (most reads of a request/response).
                        rx = self.receiver
                        if rx.status_urgent or rx.new_due or rx.replies or rx.controls:
                            q._after_read(now, False)
                        return item, timeout
                    q._after_read(now)
                    continue
                now = _mono()
                if now < q._rel_at:
                    break  # timed out, closed, or an ICMP error: the general path decides
                # A timer cut the wait: the next turn fires it and reads on.
        finally:
            if self.rx_lock is not None:
                self.rx_lock.release_held()
            else:
                self.rx_release()
        if bounded:
            left = <double>timeout - (_mono() - start)
            return None, (left if left > 0.0 else 0.0)
        return None, None

    cdef bint _awaits(self) except -1:
        cdef long long sent = self.batcher.messages_sent
        cdef long long got = self.receiver.messages_received
        cdef long long ahead = self.ahead
        cdef long long came = got - self.got_seen
        cdef long long went = sent - self.sent_seen
        cdef long long surplus
        self.trial = False
        if came <= ahead:
            ahead += went - came
        elif went:
            surplus = came - ahead
            ahead = went - surplus if surplus < went else 1
        else:
            ahead = 0
        if ahead > self.ahead_cap:
            ahead = self.ahead_cap
        self.ahead = ahead
        self.sent_seen = sent
        self.got_seen = got
        if ahead == self.ahead_cap and came == 1 and went == 1:
            self.lockstep += 1
            if self.lockstep >= self.lockstep_n:
                self.lockstep = 0
                self.trial = True
                return True
        else:
            self.lockstep = 0
        return ahead == self.ahead_poll

    cdef bint _trial_poll(self, bint has_wait, double wait) except -1:
        cdef double spin
        if self._poll(0.0) > 0:
            return True  # queued already: it tells nothing
        spin = self.spin_max if not has_wait or self.spin_max < wait else wait
        if spin <= 0.0 or self._poll(spin) <= 0:
            return False
        self.ahead = self.ahead_poll
        self.spin = self.spin_max
        self.spin_rest = 0
        return True

    cdef bint _poll_first(self, bint has_wait, double wait) except -1:
        cdef double spin = self.spin
        cdef bint cut = False
        cdef int got
        if spin == 0.0:
            self.spin_rest -= 1
            if self.spin_rest > 0:
                return False
            spin = self.spin = self.spin_max
        if has_wait and wait < spin:
            spin = wait
            cut = True
        if spin <= 0.0:
            return False
        got = self._poll(spin)
        if got < 0:
            # Another process ran on this CPU while this one yielded.
            self.crowded += 1
            if self.crowded >= self.crowded_off:
                self.spin = 0.0
                self.spin_rest = self.crowded_rest
                self.crowded = 0
                self.crowded_rest = min(self.crowded_rest * 2, self.crowded_rest_max)
            return False
        self.crowded = 0
        self.crowded_rest = self.crowded_rest_n
        if got > 0:
            self.spin = self.spin_max
            return True
        if cut:
            return False  # ended by the read's bound (a timer due), not for want of a datagram
        if self.spin * 0.5 < self.spin_max * self.spin_floor:
            self.spin = 0.0
            self.spin_rest = self.spin_rest_n
        else:
            self.spin *= 0.5
        return False

    def awaits_one_answer(self):
        """See :meth:`cmq.net._reader.DirectReader.awaits_one_answer`."""
        return self._awaits()

    def trial_poll(self, wait):
        """See :meth:`cmq.net._reader.DirectReader.trial_poll`."""
        return self._trial_poll(wait is not None, 0.0 if wait is None else wait)

    def poll_first(self, wait):
        """See :meth:`cmq.net._reader.DirectReader.poll_first`."""
        return self._poll_first(wait is not None, 0.0 if wait is None else wait)
