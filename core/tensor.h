// Tensor: a typed, shaped, contiguous view into reference-counted storage on a device.
// Views (slices along the first axis, reshapes, flat ranges) share storage; the
// training code keeps each model's parameters in one flat buffer and views into it.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace st {

enum class Device { CPU, CUDA };
const char* device_name(Device d);

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

// Raw bytes owned by one allocator; the deleter knows how to free them.
struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device = Device::CPU;
  std::function<void(void*)> deleter;
  ~Storage() {
    if (data && deleter) deleter(data);
  }
};

class Tensor {
 public:
  Tensor() = default;
  // Host allocation (64-byte aligned). Device tensors come from Backend::alloc.
  static Tensor empty(const Shape& shape, DType dtype);
  static Tensor zeros(const Shape& shape, DType dtype);
  static Tensor wrap(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype,
                     size_t offset_elems = 0);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const;  // negative i counts from the end
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device : Device::CPU; }
  size_t offset() const { return offset_; }
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  void* raw() const;
  // Typed access; throws if T does not match the storage dtype.
  template <class T>
  T* data() const;

  Tensor view(const Shape& shape) const;                  // same elements, new shape
  Tensor slice(int64_t begin, int64_t end) const;         // rows [begin, end) of axis 0
  Tensor flat(int64_t begin, int64_t count, const Shape& shape) const;  // flat range
  Tensor operator[](int64_t i) const;                     // row i of axis 0, rank - 1

  std::string desc() const;  // "bf16[4, 64, 768] cpu"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // in elements
  Shape shape_;
  DType dtype_ = DType::F32;
};

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::F64;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::I32;
};
template <>
struct dtype_of<uint16_t> {  // bf16 or fp16 bits; checked by storage size only
  static constexpr DType value = DType::BF16;
};

template <class T>
T* Tensor::data() const {
  ST_CHECK(defined(), "undefined tensor");
  ST_CHECK(device() == Device::CPU, "typed host access to device tensor ", desc(),
           " (use raw() for device pointers)");
  if constexpr (std::is_same_v<T, uint16_t>) {
    ST_CHECK(dtype_ == DType::BF16 || dtype_ == DType::F16, "tensor ", desc(),
             " accessed as 16-bit");
  } else {
    ST_CHECK(dtype_ == dtype_of<T>::value, "tensor ", desc(), " accessed as ",
             dtype_name(dtype_of<T>::value));
  }
  return static_cast<T*>(raw());
}

// Checks used at every backend entry point.
void check_shape(const Tensor& t, const Shape& expected, const char* what);
void check_same(const Tensor& a, const Tensor& b, const char* what);
// Whether the bytes of a and b intersect (false for undefined or empty tensors; host or
// device pointers alike).
bool overlaps(const Tensor& a, const Tensor& b);

}  // namespace st
