#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

namespace st {

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    ST_CHECK(d >= 0, "negative dimension in shape ", shape_str(s));
    n *= d;
  }
  return n;
}

Tensor Tensor::empty(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  auto s = std::make_shared<Storage>();
  const size_t alloc = (bytes + 63) / 64 * 64;
  s->data = alloc ? std::aligned_alloc(64, alloc) : nullptr;
  ST_CHECK(alloc == 0 || s->data, "host allocation of ", bytes, " bytes failed");
  s->bytes = bytes;
  s->device = Device::CPU;
  s->deleter = [](void* p) { std::free(p); };
  return wrap(std::move(s), shape, dtype);
}

Tensor Tensor::zeros(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  if (t.nbytes()) std::memset(t.raw(), 0, t.nbytes());
  return t;
}

Tensor Tensor::wrap(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype,
                    size_t offset_elems) {
  Tensor t;
  t.storage_ = std::move(storage);
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.offset_ = offset_elems;
  ST_CHECK((offset_elems + shape_numel(shape)) * dtype_size(dtype) <= t.storage_->bytes,
           "view ", shape_str(shape), " at offset ", offset_elems, " exceeds storage of ",
           t.storage_->bytes, " bytes");
  return t;
}

int64_t Tensor::dim(int i) const {
  const int n = ndim();
  if (i < 0) i += n;
  ST_CHECK(i >= 0 && i < n, "dimension ", i, " out of range for ", desc());
  return shape_[i];
}

void* Tensor::raw() const {
  ST_CHECK(defined(), "undefined tensor");
  return static_cast<char*>(storage_->data) + offset_ * dtype_size(dtype_);
}

Tensor Tensor::view(const Shape& shape) const {
  ST_CHECK(shape_numel(shape) == numel(), "cannot view ", desc(), " as ", shape_str(shape));
  return wrap(storage_, shape, dtype_, offset_);
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  ST_CHECK(ndim() >= 1 && begin >= 0 && begin <= end && end <= shape_[0], "slice [", begin,
           ", ", end, ") of ", desc());
  Shape s = shape_;
  s[0] = end - begin;
  const int64_t row = s[0] ? shape_numel(s) / s[0] : shape_numel(Shape(shape_.begin() + 1, shape_.end()));
  return wrap(storage_, s, dtype_, offset_ + static_cast<size_t>(begin * row));
}

Tensor Tensor::flat(int64_t begin, int64_t count, const Shape& shape) const {
  ST_CHECK(begin >= 0 && count >= 0 && begin + count <= numel(), "flat range [", begin, ", ",
           begin + count, ") of ", desc());
  ST_CHECK(shape_numel(shape) == count, "flat range of ", count, " elements viewed as ",
           shape_str(shape));
  return wrap(storage_, shape, dtype_, offset_ + static_cast<size_t>(begin));
}

Tensor Tensor::operator[](int64_t i) const {
  Tensor r = slice(i, i + 1);
  return r.view(Shape(shape_.begin() + 1, shape_.end()));
}

std::string Tensor::desc() const {
  if (!defined()) return "<undefined>";
  return std::string(dtype_name(dtype_)) + shape_str(shape_) + " " + device_name(device());
}

void check_shape(const Tensor& t, const Shape& expected, const char* what) {
  ST_CHECK(t.defined(), what, " is undefined, expected shape ", shape_str(expected));
  ST_CHECK(t.shape() == expected, what, " has shape ", shape_str(t.shape()), ", expected ",
           shape_str(expected));
}

void check_same(const Tensor& a, const Tensor& b, const char* what) {
  ST_CHECK(a.shape() == b.shape() && a.dtype() == b.dtype(), what, ": ", a.desc(), " vs ",
           b.desc());
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined() || a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* pa = static_cast<const char*>(a.raw());
  const auto* pb = static_cast<const char*>(b.raw());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

}  // namespace st
