"""Software prefetch for kernels that read per-object rows in an order of their own (an update list's
order, scattered over the handle-ordered object arrays): the row some iterations ahead is requested
from memory while the current one is processed."""
import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _prefetch(builder, data, offset, write: bool = True) -> None:
    """Emit LLVM's prefetch of the cache line at byte ``offset`` from the pointer ``data`` (for writing,
    or with ``write=False`` for reading only; high locality, data cache)."""
    base = builder.ptrtoint(data, cgutils.intp_t)
    addr = builder.inttoptr(builder.add(base, offset), ir.IntType(8).as_pointer())
    i32 = ir.IntType(32)
    fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
    builder.call(fn, [addr, ir.Constant(i32, int(write)), ir.Constant(i32, 3), ir.Constant(i32, 1)])


def _row_intrinsic(write: bool):
    """The typing and code of a row prefetch (for writing too, or for reading only)."""
    def _prefetch_row(typingctx, arr, row):
        if not isinstance(arr, types.Array) or not isinstance(row, types.Integer):
            return None
        sig = types.void(arr, row)

        def codegen(context, builder, signature, args):
            aty, _ = signature.args
            ary = context.make_array(aty)(context, builder, args[0])
            idx = context.cast(builder, args[1], signature.args[1], types.intp)
            stride = builder.extract_value(ary.strides, 0)
            _prefetch(builder, ary.data, builder.mul(idx, stride), write)
            return context.get_dummy_value()

        return sig, codegen

    _prefetch_row.__name__ = _prefetch_row.__qualname__ = "prefetch_row" if write else "prefetch_row_read"
    return _prefetch_row


#: Prefetch the first cache line of ``arr[row]`` (2-D C-contiguous array; for writing too).
_prefetch_row = _row_intrinsic(True)
#: The same for rows that are only read: no request for ownership of the line, so a row another core
#: wrote (or reads) stays shared instead of moving to this core.
_prefetch_row_read = _row_intrinsic(False)


def _prefetch_flat(typingctx, arr, index):
    """Prefetch the cache line of the element at flat position ``index`` of a C-contiguous array (for
    writing too): ``arr.ravel()[index]`` without making the view."""
    if not isinstance(arr, types.Array) or arr.layout != "C" or not isinstance(index, types.Integer):
        return None
    sig = types.void(arr, index)

    def codegen(context, builder, signature, args):
        aty, _ = signature.args
        ary = context.make_array(aty)(context, builder, args[0])
        idx = context.cast(builder, args[1], signature.args[1], types.intp)
        size = context.get_constant(types.intp, context.get_abi_sizeof(context.get_data_type(aty.dtype)))
        _prefetch(builder, ary.data, builder.mul(idx, size))
        return context.get_dummy_value()

    return sig, codegen


if numba.config.DISABLE_JIT:
    def prefetch_row(arr, row):
        """(Kernels run as Python: nothing to prefetch.)"""

    def prefetch_row_read(arr, row):
        """(Kernels run as Python: nothing to prefetch.)"""

    def prefetch_flat(arr, index):
        """(Kernels run as Python: nothing to prefetch.)"""
else:
    prefetch_row = intrinsic(_prefetch_row)
    prefetch_row_read = intrinsic(_prefetch_row_read)
    prefetch_flat = intrinsic(_prefetch_flat)
