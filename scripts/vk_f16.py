"""What the Vulkan driver reports for 16-bit floats, per physical device, through the loader with ctypes (no
vulkaninfo on the lent machine): the features Dawn and wgpu look at before they offer WebGPU's `shader-f16`.

    python3 scripts/vk_f16.py        # one JSON line per device

Dawn (Chromium's WebGPU, src/dawn/native/vulkan/PhysicalDeviceVk.cpp) needs shaderFloat16 and
storageBuffer16BitAccess (and, depending on its version, uniformAndStorageBuffer16BitAccess or
storageInputOutput16), and on NVIDIA it also needs its adapter toggle `vulkan_enable_f16_on_nvidia`.
"""

from __future__ import annotations

import ctypes as C
import json
import sys

VK_STRUCTURE_TYPE_APPLICATION_INFO = 0
VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO = 1
VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2 = 1000059000
VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2 = 1000059001
VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES = 49
VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES = 51


class AppInfo(C.Structure):
    _fields_ = [("sType", C.c_int), ("pNext", C.c_void_p), ("pApplicationName", C.c_char_p),
                ("applicationVersion", C.c_uint32), ("pEngineName", C.c_char_p), ("engineVersion", C.c_uint32),
                ("apiVersion", C.c_uint32)]


class InstanceInfo(C.Structure):
    _fields_ = [("sType", C.c_int), ("pNext", C.c_void_p), ("flags", C.c_uint32), ("pApplicationInfo", C.c_void_p),
                ("enabledLayerCount", C.c_uint32), ("ppEnabledLayerNames", C.c_void_p),
                ("enabledExtensionCount", C.c_uint32), ("ppEnabledExtensionNames", C.c_void_p)]


class Vk11Features(C.Structure):      # VkPhysicalDeviceVulkan11Features: 12 VkBool32 after the header
    _fields_ = [("sType", C.c_int), ("pNext", C.c_void_p)] + [(n, C.c_uint32) for n in (
        "storageBuffer16BitAccess", "uniformAndStorageBuffer16BitAccess", "storagePushConstant16",
        "storageInputOutput16", "multiview", "multiviewGeometryShader", "multiviewTessellationShader",
        "variablePointersStorageBuffer", "variablePointers", "protectedMemory", "samplerYcbcrConversion",
        "shaderDrawParameters")]


class Vk12Features(C.Structure):      # VkPhysicalDeviceVulkan12Features: the first 6 of its 47 booleans, then room
    _fields_ = [("sType", C.c_int), ("pNext", C.c_void_p)] + [(n, C.c_uint32) for n in (
        "samplerMirrorClampToEdge", "drawIndirectCount", "storageBuffer8BitAccess",
        "uniformAndStorageBuffer8BitAccess", "storagePushConstant8", "shaderBufferInt64Atomics",
        "shaderSharedInt64Atomics", "shaderFloat16", "shaderInt8")] + [("rest", C.c_uint32 * 64)]


class Features2(C.Structure):         # VkPhysicalDeviceFeatures2: 55 VkBool32 of VkPhysicalDeviceFeatures
    _fields_ = [("sType", C.c_int), ("pNext", C.c_void_p), ("features", C.c_uint32 * 55)]


class Properties2(C.Structure):       # VkPhysicalDeviceProperties2 with VkPhysicalDeviceProperties inside
    _fields_ = [("sType", C.c_int), ("pNext", C.c_void_p), ("apiVersion", C.c_uint32), ("driverVersion", C.c_uint32),
                ("vendorID", C.c_uint32), ("deviceID", C.c_uint32), ("deviceType", C.c_int),
                ("deviceName", C.c_char * 256), ("rest", C.c_uint8 * 1024)]


def main() -> int:
    vk = C.CDLL("libvulkan.so.1")
    app = AppInfo(VK_STRUCTURE_TYPE_APPLICATION_INFO, None, b"vk_f16", 1, b"lab", 1, (1 << 22) | (3 << 12))
    ci = InstanceInfo(VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, None, 0, C.cast(C.pointer(app), C.c_void_p), 0, None, 0, None)
    inst = C.c_void_p()
    r = vk.vkCreateInstance(C.byref(ci), None, C.byref(inst))
    if r != 0:
        print(json.dumps({"error": f"vkCreateInstance: {r}"}))
        return 1
    n = C.c_uint32()
    vk.vkEnumeratePhysicalDevices(inst, C.byref(n), None)
    devs = (C.c_void_p * n.value)()
    vk.vkEnumeratePhysicalDevices(inst, C.byref(n), devs)
    for d in devs:
        v12 = Vk12Features(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, None)
        v11 = Vk11Features(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, C.cast(C.pointer(v12), C.c_void_p))
        f2 = Features2(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, C.cast(C.pointer(v11), C.c_void_p))
        vk.vkGetPhysicalDeviceFeatures2(C.c_void_p(d), C.byref(f2))
        p2 = Properties2(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, None)
        vk.vkGetPhysicalDeviceProperties2(C.c_void_p(d), C.byref(p2))
        a = p2.apiVersion
        print(json.dumps({
            "device": p2.deviceName.decode(), "vendorID": hex(p2.vendorID), "deviceType": p2.deviceType,
            "api": f"{a >> 22}.{(a >> 12) & 0x3ff}.{a & 0xfff}", "driverVersion": p2.driverVersion,
            "shaderFloat16": bool(v12.shaderFloat16), "shaderInt8": bool(v12.shaderInt8),
            "storageBuffer16BitAccess": bool(v11.storageBuffer16BitAccess),
            "uniformAndStorageBuffer16BitAccess": bool(v11.uniformAndStorageBuffer16BitAccess),
            "storagePushConstant16": bool(v11.storagePushConstant16),
            "storageInputOutput16": bool(v11.storageInputOutput16)}), flush=True)
    vk.vkDestroyInstance(inst, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
