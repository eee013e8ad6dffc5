# cython: language_level=3, boundscheck=False, wraparound=False
"""RouterIO, native: the broker loop's socket work per turn in C, against libzmq through pyzmq's Cython API.

The contract is routerio.py's, which is the reference and the fallback
(MC0_PURE_PYTHON=1): one C call per turn for each of ``poll`` (zmq_poll
over items built once, the GIL released while it waits), ``receive`` (every
ready message of the ROUTER into one list: each frame read into a zmq_msg_t
on the C stack and made bytes, the routing id's SRCFD, User-Id and
Peer-Address read from its message with zmq_msg_get / zmq_msg_gets, no
zmq.Frame, no exception at the end) and ``send`` (each message's frames
copied into libzmq with zmq_send, NOBLOCK, in order, stopping at the first
refused).  Built by setup.py beside the mypyc modules (mc0/native.py).
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_CheckExact, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.exc cimport PyErr_CheckSignals
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.errno cimport EAGAIN, EINTR
from zmq.backend.cython cimport libzmq
from zmq.backend.cython.libzmq cimport zmq_msg_t, zmq_pollitem_t

import zmq

cdef int DONTWAIT = libzmq.ZMQ_DONTWAIT
cdef int MORE_DONTWAIT = libzmq.ZMQ_SNDMORE | libzmq.ZMQ_DONTWAIT


cdef inline void *_handle(object sock):
    return <void *><size_t>sock.underlying


cdef inline bytes _take(zmq_msg_t *msg):
    return PyBytes_FromStringAndSize(<char *>libzmq.zmq_msg_data(msg), <Py_ssize_t>libzmq.zmq_msg_size(msg))


cdef inline object _property(zmq_msg_t *msg, const char *name):
    cdef const char *value = libzmq.zmq_msg_gets(msg, name)
    if value == NULL:
        return None
    return (<bytes>value).decode("utf8")


cdef class RouterIO:
    cdef void *_router
    cdef zmq_pollitem_t *_items
    cdef int _count
    cdef bint _curve
    cdef object _sockets  # the sockets polled (kept alive while their handles are used)
    cdef public bint read_empty
    cdef public Py_ssize_t received_bytes

    def __cinit__(self, router, others, *, bint curve):
        self._sockets = [router, *others]
        self._count = len(self._sockets)
        self._items = <zmq_pollitem_t *>PyMem_Malloc(self._count * sizeof(zmq_pollitem_t))
        if self._items == NULL:
            raise MemoryError()
        cdef int i
        for i, item in enumerate(self._sockets):
            if isinstance(item, int):
                self._items[i].socket = NULL
                self._items[i].fd = item
            else:
                self._items[i].socket = _handle(item)
                self._items[i].fd = 0
            self._items[i].events = libzmq.ZMQ_POLLIN
            self._items[i].revents = 0
        self._router = self._items[0].socket
        self._curve = curve
        self.read_empty = False
        self.received_bytes = 0

    def __dealloc__(self):
        PyMem_Free(self._items)

    @property
    def router(self):
        return self._sockets[0]

    def poll(self, long timeout_ms, bint held):
        cdef int first = 1 if held else 0
        cdef int rc
        cdef int i
        cdef long ready = 0
        with nogil:
            rc = libzmq.zmq_poll(self._items + first, self._count - first, timeout_ms)
        if rc < 0:
            if libzmq.zmq_errno() == EINTR:
                PyErr_CheckSignals()  # (the handler ran: the loop looks at its stop flag)
                return 0
            raise zmq.ZMQError(libzmq.zmq_errno())
        if rc == 0:
            return 0
        for i in range(first, self._count):
            if self._items[i].revents & libzmq.ZMQ_POLLIN:
                ready |= 1 << i
        return ready

    def receive(self, int limit, Py_ssize_t max_bytes, sessions):
        cdef zmq_msg_t msg
        cdef void *router = self._router
        cdef int rc, err, fd, more
        cdef Py_ssize_t received = 0
        cdef bytes routing_id, frame
        cdef list out = []
        cdef list frames
        self.read_empty = False
        for _ in range(limit):
            libzmq.zmq_msg_init(&msg)
            rc = libzmq.zmq_msg_recv(&msg, router, DONTWAIT)
            while rc < 0 and libzmq.zmq_errno() == EINTR:
                rc = libzmq.zmq_msg_recv(&msg, router, DONTWAIT)
            if rc < 0:
                err = libzmq.zmq_errno()
                libzmq.zmq_msg_close(&msg)
                if err == EAGAIN:
                    self.read_empty = True
                    break
                raise zmq.ZMQError(err)
            routing_id = _take(&msg)
            fd = libzmq.zmq_msg_get(&msg, libzmq.ZMQ_SRCFD)
            identity = _property(&msg, b"User-Id") if self._curve else None
            if identity == "":
                identity = None
            address = None
            if routing_id not in sessions:
                address = _property(&msg, b"Peer-Address")
                if address is None:
                    address = ""
            more = libzmq.zmq_msg_more(&msg)
            libzmq.zmq_msg_close(&msg)
            frames = []
            frame = None
            while more:  # (a message's frames arrive together: the rest is there)
                libzmq.zmq_msg_init(&msg)
                rc = libzmq.zmq_msg_recv(&msg, router, DONTWAIT)
                while rc < 0 and libzmq.zmq_errno() == EINTR:
                    rc = libzmq.zmq_msg_recv(&msg, router, DONTWAIT)
                if rc < 0:
                    err = libzmq.zmq_errno()
                    libzmq.zmq_msg_close(&msg)
                    raise zmq.ZMQError(err)
                frame = _take(&msg)
                frames.append(frame)
                more = libzmq.zmq_msg_more(&msg)
                libzmq.zmq_msg_close(&msg)
            out.append((routing_id, frames, fd, identity, address))
            if frame is not None:
                received += PyBytes_GET_SIZE(frame)
                if received >= max_bytes:
                    break
        self.received_bytes = received
        return out

    def send(self, messages, Py_ssize_t start=0):
        cdef void *router = self._router
        cdef Py_ssize_t index, count = len(messages), last, j
        cdef int err
        for index in range(start, count):
            routing_id, frames = messages[index]
            last = len(frames) - 1
            if last < 0:
                raise ValueError("a message has at least one frame")
            err = _send_frame(router, routing_id, MORE_DONTWAIT)  # refused here, before any body frame
            if err:
                return index, err
            for j in range(last + 1):
                err = _send_frame(router, frames[j], MORE_DONTWAIT if j < last else DONTWAIT)
                if err:
                    return index, err
        return count, 0


cdef int _send_frame(void *router, object data, int flags) except -1:
    """0, or libzmq's errno for a frame it refused (bytes, or anything with the buffer protocol)."""
    cdef Py_buffer view
    cdef int rc
    if PyBytes_CheckExact(data):
        rc = libzmq.zmq_send(router, PyBytes_AS_STRING(data), <size_t>PyBytes_GET_SIZE(data), flags)
        while rc < 0 and libzmq.zmq_errno() == EINTR:
            rc = libzmq.zmq_send(router, PyBytes_AS_STRING(data), <size_t>PyBytes_GET_SIZE(data), flags)
    else:
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            rc = libzmq.zmq_send(router, view.buf, <size_t>view.len, flags)
            while rc < 0 and libzmq.zmq_errno() == EINTR:
                rc = libzmq.zmq_send(router, view.buf, <size_t>view.len, flags)
        finally:
            PyBuffer_Release(&view)
    if rc < 0:
        return libzmq.zmq_errno()
    return 0
